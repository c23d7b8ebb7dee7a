"""The reference-model audit: a local reference process (exact log-probabilities, any number of
samples) against a target that only returns continuations (a text endpoint, a pool of answers,
another process used as a black box), one target call per prompt.

    from tvjax.audit.reference import process_calls, reference_audit
    calls = process_calls(jax.random.key(0), [target], prompts=np.zeros(400, int))
    result = reference_audit(jax.random.key(1), [reference], calls, m=32)
    result.pvalue, result.lower_bound            # exact-null p-value; TV >= lower_bound at 1 - delta

Modules:
  ranks:      target_ranks (ties at random), rank_test (cvm, ks, stratified, combined; exact null),
              exchangeable_test (all scores at once, exact)
  certify:    rank_bound (dkw, split binomial), per_prompt_bounds: certified TV lower bounds
  sequential: anytime_bound, rank_gate: the anytime-valid bound and the gate's decision
  scores:     logprob, mean_logprob, length, log_rank (RUT's), learned
  audit:      TargetCalls, process_calls, reference_audit; score_ranks / round_ranks for the gate
  endpoint:   a text endpoint's answers as TargetCalls (text round trip), the grey-box test
"""

from tvjax.audit.reference.audit import (
    DEFAULT_SCORES,
    ReferenceAuditResult,
    ScoreAudit,
    TargetCalls,
    process_calls,
    reference_audit,
    reference_rows,
    round_ranks,
    score_ranks,
)
from tvjax.audit.reference.certify import RankBound, binomial_bound, dkw_bound, per_prompt_bounds, rank_bound
from tvjax.audit.reference.ranks import ExchangeableTest, RankTest, exchangeable_test, rank_test, target_ranks
from tvjax.audit.reference.scores import SCORES, LearnedScore, continuation_features, fit_learned_score
from tvjax.audit.reference.sequential import (
    AnytimeRankBound,
    ReferenceGateResult,
    anytime_bound,
    rank_gate,
    rank_sequence_start,
    rank_sequence_update,
)

__all__ = ["ExchangeableTest", "exchangeable_test", "DEFAULT_SCORES", "ReferenceAuditResult", "ScoreAudit",
           "TargetCalls", "process_calls", "reference_audit", "reference_rows", "round_ranks", "score_ranks",
           "RankBound", "binomial_bound", "dkw_bound", "per_prompt_bounds", "rank_bound", "RankTest", "rank_test",
           "target_ranks", "SCORES", "LearnedScore", "continuation_features", "fit_learned_score", "AnytimeRankBound",
           "ReferenceGateResult", "anytime_bound", "rank_gate", "rank_sequence_start", "rank_sequence_update"]
