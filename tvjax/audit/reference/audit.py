"""The reference-model audit: a local reference process against a target that only returns samples.

    calls = process_calls(jax.random.key(0), [target], prompts=np.zeros(400, int))   # or endpoint_calls
    result = reference_audit(jax.random.key(1), [reference], calls, m=32)
    result.pvalue, result.lower_bound, result.scores["logprob"].test.pvalues

`references[p]` is the reference process of prompt p (any tvjax process: a LanguageModel of
`tvjax.models.prompt_processes`, a synthetic instance); a call is one target continuation of one
prompt, as the reference's token ids. For every call the audit draws m fresh reference
continuations of the same prompt, scores all m + 1 with each score of `scores`
(`tvjax.audit.reference.scores`), ranks the target's among them, tests each score's ranks for
uniformity (`ranks.rank_test`) and bounds TV from below (`certify.rank_bound`). The headline
p-value is one exact test over all the fixed scores at once (`ranks.exchangeable_test`: no
correction for their number), times 2 when the learned score is one of them (Bonferroni with its
own test); the headline bound is the largest of the scores' bounds, each at delta / their number.

`canonical` (optional, tokens [k, n] -> tokens [k, n]) maps reference continuations through
whatever the target's answers went through before they became token ids (an endpoint's text:
decode, then encode with the reference tokenizer), so that both sides of every rank are the same
function of a continuation and the null stays exact.
"""

from typing import NamedTuple

import jax
import numpy as np

from tvjax.audit.reference.certify import RankBound, rank_bound
from tvjax.audit.reference.ranks import DEFAULT_DRAWS, ExchangeableTest, RankTest, exchangeable_test, rank_test, target_ranks
from tvjax.audit.reference.scores import (
    FEATURES,
    NEEDS_LOGITS,
    check_score_names,
    chunk_rows,
    continuation_features,
    fit_learned_score,
)
from tvjax.core.validate import check_key, check_positive_int, check_range

DEFAULT_SCORES = ("logprob", "mean_logprob", "length")


class TargetCalls(NamedTuple):
    """The target's continuations tokens int [N, n] (as the reference pads them) and the prompt
    index of each call, prompts int [N]."""

    tokens: np.ndarray
    prompts: np.ndarray


def check_calls(calls, references):
    tokens, prompts = np.asarray(calls.tokens), np.asarray(calls.prompts)
    if tokens.ndim != 2 or prompts.shape != (tokens.shape[0],) or tokens.shape[0] == 0:
        raise ValueError(f"calls need tokens [N, n] and prompts [N] with N >= 1, got {tokens.shape} and {prompts.shape}")
    if not np.issubdtype(prompts.dtype, np.integer) or prompts.min() < 0 or prompts.max() >= len(references):
        raise ValueError(f"call prompts must be indices into the {len(references)} reference processes, "
                         f"found {prompts.min()}..{prompts.max()}")
    widths = {int(r.n) for r in references}
    if widths != {tokens.shape[1]}:
        raise ValueError(f"the target continuations have n={tokens.shape[1]} positions, the references {sorted(widths)}")
    return TargetCalls(tokens.astype(np.int32), prompts.astype(np.int64))


def sample_rows(key, process, num):
    """num continuations of a process [num, n], in chunks of its max_chunk_rows (one program)."""
    chunk = chunk_rows(process, num)
    pieces = [np.asarray(process.sample(jax.random.fold_in(key, i), chunk)) for i in range(-(-num // chunk))]
    return np.concatenate(pieces)[:num]


def process_calls(key, targets, prompts):
    """TargetCalls of target processes used as black boxes: call i one sample of targets[prompts[i]]."""
    check_key(key)
    prompts = np.asarray(prompts, np.int64)
    tokens = np.zeros((prompts.shape[0], targets[0].n), np.int32)
    for p in np.unique(prompts):
        rows = np.flatnonzero(prompts == p)
        tokens[rows] = sample_rows(jax.random.fold_in(key, int(p)), targets[int(p)], rows.size)
    return TargetCalls(tokens, prompts)


def reference_rows(key, references, prompts, m, canonical=None):
    """int [N, m, n]: m fresh reference continuations of each call's prompt (through `canonical`)."""
    out = np.zeros((prompts.shape[0], m, references[0].n), np.int32)
    for p in np.unique(prompts):
        rows = np.flatnonzero(prompts == p)
        drawn = sample_rows(jax.random.fold_in(key, int(p)), references[int(p)], rows.size * m)
        if canonical is not None:
            drawn = np.asarray(canonical(drawn), np.int32)
        out[rows] = drawn.reshape(rows.size, m, -1)
    return out


def call_features(references, prompts, tokens, with_ranks):
    """{feature: [N, k]} of tokens [N, k, n] under each row's prompt's reference. Each distinct
    continuation of a prompt is scored once, so equal continuations get bitwise equal scores (a
    compiled program's float32 result can depend on its batch shape, and a tie between the
    target's continuation and an equal reference one must stay a tie, broken at random, for the
    null to stay exact)."""
    num, k, n = tokens.shape
    out = {}
    for p in np.unique(prompts):
        rows = np.flatnonzero(prompts == p)
        distinct, inverse = np.unique(tokens[rows].reshape(-1, n), axis=0, return_inverse=True)
        # the number of distinct rows varies from call to call: padded (repeating the first) to a
        # power of two below the process's chunk, so that a handful of programs serve every audit
        size = distinct.shape[0]
        padded = max(size, min(1 << (size - 1).bit_length(), chunk_rows(references[int(p)], 1 << 62)))
        distinct = np.concatenate([distinct, np.repeat(distinct[:1], padded - size, axis=0)])
        features = continuation_features(references[int(p)], distinct, with_ranks)
        for name, value in features.items():
            out.setdefault(name, np.zeros((num, k)))[rows] = value[:size][inverse.reshape(-1)].reshape(rows.size, k)
    return out


def joint_features(references, prompts, target_tokens, reference_tokens, with_ranks):
    """({feature: [N, 1]}, {feature: [N, m]}): call_features of the target's continuations [N, n]
    and the reference's [N, m, n] in one pass, so that a target continuation equal to a reference
    one gets the same score (see call_features)."""
    both = call_features(references, prompts, np.concatenate([target_tokens[:, None], reference_tokens], axis=1),
                         with_ranks)
    return {f: v[:, :1] for f, v in both.items()}, {f: v[:, 1:] for f, v in both.items()}


class ScoreAudit(NamedTuple):
    """One score's ranks (int [calls used]), uniformity tests and certified bound (at the level of
    the headline's share of delta)."""

    ranks: np.ndarray
    test: RankTest
    bound: RankBound


class ReferenceAuditResult(NamedTuple):
    """pvalue: the joint exact test of the fixed scores (`joint`), Bonferroni with the learned
    score's `test_statistic` p-value where it is asked for; lower_bound: the
    largest of the scores' bounds, each at delta / len(scores): TV >= lower_bound with probability
    >= 1 - delta. mismatch_share: the share of target calls the reference cannot produce (log p
    = -inf: support mismatch, itself a certified difference)."""

    pvalue: float
    lower_bound: float
    best_score: str
    scores: dict  # name -> ScoreAudit
    calls: int
    m: int
    mismatch_share: float
    delta: float
    test_statistic: str
    joint: ExchangeableTest | None  # None when the learned score is the only one


def reference_audit(key, references, calls, m=32, scores=DEFAULT_SCORES, delta=0.05, bound="binomial",
                    test_statistic="combined", learned_share=0.5, draws=DEFAULT_DRAWS, canonical=None):
    """The audit of target `calls` against the reference processes (see the module doc).
    learned_share: the share of calls (the first ones) that fits the learned score, whose ranks
    and bound use only the rest."""
    check_key(key)
    references = list(references)
    if not references:
        raise ValueError("no reference processes")
    calls = check_calls(calls, references)
    m = check_positive_int("m", m)
    scores = check_score_names(scores)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    if test_statistic not in ("cvm", "ks", "stratified", "combined"):
        raise ValueError(f"test_statistic must be cvm, ks, stratified or combined, got {test_statistic!r}")
    key_reference, key_ties, key_null = jax.random.split(key, 3)
    reference = reference_rows(key_reference, references, calls.prompts, m, canonical)
    with_ranks = any(s in NEEDS_LOGITS for s in scores) or "learned" in scores
    target_features, reference_features = joint_features(references, calls.prompts, calls.tokens, reference, with_ranks)
    num = calls.tokens.shape[0]
    share = delta / len(scores)
    audits = {}
    for index, name in enumerate(scores):
        rows = np.arange(num)
        if name == "learned":
            train = int(round(learned_share * num))
            if not 1 <= train < num:
                raise ValueError(f"the learned score needs calls to fit and to test: {num} calls at learned_share "
                                 f"{learned_share} leave {train} to fit")
            learned = fit_learned_score({f: target_features[f][:train, 0] for f in FEATURES},
                                        {f: reference_features[f][:train].ravel() for f in FEATURES})
            rows = rows[train:]
            target_score = learned({f: target_features[f][rows, 0] for f in FEATURES})
            reference_score = learned({f: reference_features[f][rows] for f in FEATURES})
        else:
            target_score, reference_score = target_features[name][rows, 0], reference_features[name][rows]
        ranks = target_ranks(jax.random.fold_in(key_ties, index), target_score, reference_score)
        test = rank_test(jax.random.fold_in(key_null, index), ranks, m, calls.prompts[rows], draws)
        audits[name] = ScoreAudit(ranks, test, rank_bound(ranks, m, share, bound))
    best = max(audits, key=lambda s: audits[s].bound.lower_bound)
    fixed = [s for s in scores if s != "learned"]
    joint = None if not fixed else exchangeable_test(
        jax.random.fold_in(key_null, len(scores)), np.stack([target_features[s][:, 0] for s in fixed], axis=-1),
        np.stack([reference_features[s] for s in fixed], axis=-1), draws)
    pvalues = ([joint.pvalue] if joint else []) + ([audits["learned"].test.pvalues[test_statistic]]
                                                   if "learned" in audits else [])
    mismatch = float(np.mean(np.isneginf(target_features["logprob"][:, 0])))
    return ReferenceAuditResult(min(1.0, len(pvalues) * min(pvalues)), audits[best].bound.lower_bound, best, audits, num,
                                m, mismatch, float(delta), test_statistic, joint)


def score_ranks(key, references, calls, m, score="logprob", canonical=None):
    """int32 [N]: the ranks of the calls' `score` (a fixed score: not "learned") among m fresh
    reference continuations each: one round of the anytime-valid gate."""
    if score not in FEATURES:
        raise ValueError(f"a sequential score must be one of {FEATURES} (the learned score needs a split), got {score!r}")
    calls = check_calls(calls, references)
    key_reference, key_ties = jax.random.split(key)
    reference = reference_rows(key_reference, references, calls.prompts, m, canonical)
    with_ranks = score in NEEDS_LOGITS
    target, reference = joint_features(references, calls.prompts, calls.tokens, reference, with_ranks)
    return target_ranks(key_ties, target[score][:, 0], reference[score])


def round_ranks(key, references, call_rounds, m, score="logprob", canonical=None):
    """The ranks of each round of TargetCalls of the iterable `call_rounds`, round r's reference
    continuations from fold_in(key, r): rounds for `tvjax.audit.reference.sequential.rank_gate`."""
    for index, calls in enumerate(call_rounds):
        yield score_ranks(jax.random.fold_in(key, index), references, calls, m, score, canonical)
