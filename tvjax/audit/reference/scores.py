"""Scores of continuations under the reference process, for the rank test.

A score maps (prompt, continuation) to a number and must be fixed before the ranks it makes are
tested (the learned one is fitted on calls the test does not use). All come from the reference's
exact log-probabilities of the continuation's tokens:

* logprob: log p_ref(x) over the real positions (up to and including EOS): the likelihood-ratio
  direction when the target is the reference with its distribution sharpened or flattened
  (temperature, top-p, a quantized copy that is more or less peaked);
* mean_logprob: the same per token: separates the length of a continuation from its per-token fit;
* length: the number of real positions: blind to the words, sees EOS-rate shifts (a system prompt
  that makes answers terser, a stop-sequence change); ties are heavy, broken at random;
* log_rank: the mean over positions of log(1 + #{tokens the reference ranks above x_t}): the
  score of the rank-based uniformity test (RUT, Zhu et al. 2025, arXiv 2506.06975); it needs the
  whole next-token distribution, so it costs the logits at every position;
* learned: a logistic regression of target against reference continuations on the other scores'
  features (and an indicator of a continuation the reference cannot produce), fitted on a
  training share of the calls; the test uses the rest.

-inf log-probabilities (the reference gives the target's continuation no mass: support mismatch)
are scores like any other and rank below every finite score.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core.currency import stopping_ids, trajectory_lengths

SCORES = ("logprob", "mean_logprob", "length", "log_rank", "learned")
FEATURES = ("logprob", "mean_logprob", "length", "log_rank")
NEEDS_LOGITS = ("log_rank",)


def check_score_names(scores):
    scores = tuple(scores)
    unknown = [s for s in scores if s not in SCORES]
    if not scores or unknown:
        raise ValueError(f"scores must be a non-empty subset of {SCORES}, got {list(scores)}")
    if len(set(scores)) != len(scores):
        raise ValueError(f"scores repeat a name: {list(scores)}")
    return scores


@functools.partial(jax.jit, static_argnums=2)
def _chunk_features(process, tokens, with_ranks):
    if with_ranks:  # one pass over the whole next-token distribution serves both
        distribution = process.next_token_logprobs(tokens)
        logprobs = jnp.take_along_axis(distribution, tokens[..., None], axis=-1)[..., 0]
        # log(1 + #{v: log p(v) > log p(x_t)}): the token's log-rank, 0 for the most likely one
        log_ranks = jnp.log1p(jnp.sum(distribution > logprobs[..., None], axis=-1).astype(jnp.float32))
    else:
        logprobs = process.path_logprobs(tokens)
    lengths = trajectory_lengths(tokens, stopping_ids(process))
    real = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
    total = jnp.sum(jnp.where(real, logprobs, 0.0), axis=1)
    out = {"logprob": total, "mean_logprob": total / lengths, "length": lengths.astype(jnp.float32)}
    if with_ranks:
        out["log_rank"] = jnp.sum(jnp.where(real, log_ranks, 0.0), axis=1) / lengths
    return out


def chunk_rows(process, rows):
    """Rows per chunk for a process: its max_chunk_rows where it declares one, at most `rows`."""
    return max(1, min(rows, int(getattr(process, "max_chunk_rows", None) or 1024)))


def in_chunks(fn, tokens, chunk):
    """fn over row chunks of `chunk` rows (the last padded by repeating its first row, so that one
    program serves every chunk), the pieces' leaves concatenated and cut to the rows."""
    tokens = np.asarray(tokens, np.int32)
    pieces = []
    for start in range(0, tokens.shape[0], chunk):
        piece = tokens[start : start + chunk]
        if piece.shape[0] < chunk:
            piece = np.concatenate([piece, np.repeat(piece[:1], chunk - piece.shape[0], axis=0)])
        pieces.append(jax.tree.map(np.asarray, fn(jnp.asarray(piece))))
    joined = jax.tree.map(lambda *xs: np.concatenate(xs), *pieces)
    return jax.tree.map(lambda x: x[: tokens.shape[0]], joined)


def continuation_features(process, tokens, with_ranks=False):
    """{feature: float64 [N]} of continuations tokens [N, n] under the reference `process`
    (FEATURES; log_rank only with with_ranks)."""
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim != 2 or tokens.shape[1] != process.n:
        raise ValueError(f"continuations must be token ids [N, n={process.n}], got shape {tokens.shape}")
    vocab = int(process.vocab_size)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}), found {tokens.min()}..{tokens.max()}: "
                         "continuations tokenized for another vocabulary?")
    features = in_chunks(lambda piece: _chunk_features(process, piece, with_ranks), tokens, chunk_rows(process, len(tokens)))
    return {name: np.asarray(value, np.float64) for name, value in features.items()}


class LearnedScore:
    """A linear score w . phi(features) + b fitted by logistic regression (target = 1, reference
    = 0, the classes weighted equally); phi standardizes each feature with the training
    statistics, replaces -inf by the training minimum less one spread, and adds a 0/1 column for
    a -inf logprob (a continuation the reference cannot produce)."""

    def __init__(self, names, floors, means, scales, weights):
        self.names, self.floors, self.means, self.scales, self.weights = names, floors, means, scales, weights

    def design(self, features):
        columns = []
        for name, floor, mean, scale in zip(self.names, self.floors, self.means, self.scales):
            x = np.asarray(features[name], np.float64)
            columns.append((np.where(np.isneginf(x), floor, x) - mean) / scale)
        columns.append(np.isneginf(np.asarray(features["logprob"])).astype(np.float64))
        columns.append(np.ones_like(columns[0]))
        return np.stack(columns, axis=-1)

    def __call__(self, features):
        return self.design(features) @ self.weights


def fit_learned_score(target_features, reference_features, names=None, ridge=1e-3, steps=25):
    """A LearnedScore from {feature: [N_target]} and {feature: [N_reference]} (flattened), by
    Newton's method on the ridge-penalized, class-balanced logistic loss."""
    names = tuple(names or [f for f in FEATURES if f in target_features])
    pooled = {f: np.concatenate([np.ravel(target_features[f]), np.ravel(reference_features[f])]) for f in names}
    floors, means, scales = [], [], []
    for f in names:
        finite = pooled[f][np.isfinite(pooled[f])]
        low, spread = (finite.min(), finite.std() + 1.0) if finite.size else (0.0, 1.0)
        floor = low - spread
        values = np.where(np.isneginf(pooled[f]), floor, pooled[f])
        floors.append(floor)
        means.append(values.mean())
        scales.append(values.std() + 1e-12)
    score = LearnedScore(names, floors, means, scales, np.zeros(len(names) + 2))
    x = score.design(pooled)
    num_target = np.ravel(target_features[names[0]]).shape[0]
    y = np.concatenate([np.ones(num_target), np.zeros(x.shape[0] - num_target)])
    weight = np.where(y == 1, 0.5 / max(num_target, 1), 0.5 / max(x.shape[0] - num_target, 1))
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-np.clip(x @ w, -30, 30)))
        gradient = x.T @ (weight * (p - y)) + ridge * w
        hessian = (x * (weight * p * (1 - p))[:, None]).T @ x + ridge * np.eye(x.shape[1])
        w = w - np.linalg.solve(hessian, gradient)
    score.weights = w
    return score
