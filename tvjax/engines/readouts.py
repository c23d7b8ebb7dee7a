"""Scoring from top-K readouts, in numpy: for engines that only expose top-K lists of log-probabilities
(prompt log-probs of vLLM and SGLang, OpenAI-compatible servers), so the HTTP bridge needs no torch.

A readout is {token_id: full-softmax log-prob} at one position. Banned tokens (the EOS ids under
eos=suppress; none under eos=stop) are dropped and the rest renormalized over its tie-inclusive
top-k, as `tvjax.engines.replay.topk_logprobs` does on full logits.
"""

from __future__ import annotations

import numpy as np

from tvjax.engines.protocol import Scored

NEG_INF = np.float32(-np.inf)


def renormalize_readout(token_logprob, top_logprobs, k: int) -> np.ndarray:
    """float32 [...]: top-k renormalized log-probability of a token, from an engine's top-K readout.

    token_logprob: [...] the engine's (full-softmax) log-probability of the token (-inf for a banned
    token); top_logprobs: [..., K] the engine's K largest log-probabilities with banned tokens already
    removed (-inf padding allowed), K >= k. The top-k set is the k largest entries plus any token
    tied with the k-th (ties beyond the readout are invisible to this access model); the result is
    -inf when the token is outside it.
    """
    top_logprobs = np.asarray(top_logprobs, dtype=np.float32)
    if top_logprobs.shape[-1] < k:
        raise ValueError(f"readout has {top_logprobs.shape[-1]} entries, fewer than top_k={k}")
    top = -np.sort(-top_logprobs, axis=-1)
    kth = top[..., k - 1]
    kept = np.where(top >= kth[..., None], top, NEG_INF)
    peak = kept[..., 0]  # the largest entry; finite since the k-th is
    lognorm = peak + np.log(np.exp(kept - peak[..., None]).sum(-1))
    token_logprob = np.asarray(token_logprob, dtype=np.float32)
    inside = (token_logprob >= kth) & np.isfinite(token_logprob)
    return np.where(inside, token_logprob - lognorm, NEG_INF).astype(np.float32)


def sorted_readout(readout: dict[int, float], banned: set[int]) -> list[tuple[int, float]]:
    """A readout's (id, log-prob) pairs without the banned ids, most likely first."""
    return sorted(((int(t), float(lp)) for t, lp in readout.items() if int(t) not in banned), key=lambda kv: -kv[1])


def score_trajectory(readouts: list[dict[int, float]], tokens, k: int | None, banned_ids,
                     width: int) -> Scored:
    """One trajectory's score from its per-position top-K readouts: realized [n] and the
    renormalized top-`width` readout [n, width] (ids -1 / -inf past the list).

    Banned tokens are dropped from every readout, so it must hold K >= k + len(banned_ids) entries.
    """
    if k is None:
        raise ValueError("readout-based scoring needs a finite top_k: a top-K list cannot normalize "
                         "the full distribution")
    size = max(k, width)
    banned = {int(b) for b in banned_ids}
    rows = [sorted_readout(d, banned) for d in readouts]
    short = [i for i, r in enumerate(rows) if len(r) < k]
    if short:
        raise ValueError(f"readouts at positions {short[:5]} hold fewer than top_k={k} non-banned entries")
    ids = np.full((len(rows), size), -1, dtype=np.int32)
    top = np.full((len(rows), size), NEG_INF, dtype=np.float32)
    for i, r in enumerate(rows):
        r = r[:size]
        ids[i, :len(r)] = [t for t, _ in r]
        top[i, :len(r)] = [lp for _, lp in r]
    token_lp = np.array([dict(r).get(int(t), NEG_INF) for r, t in zip(rows, tokens)], dtype=np.float32)
    values = renormalize_readout(top, np.broadcast_to(top[:, None, :], (len(rows), size, size)), k)
    return Scored(renormalize_readout(token_lp, top, k), ids[:, :width], values[:, :width])


def score_trajectories(readouts: list[list[dict[int, float]]], tokens, k: int | None, banned_ids, width: int) -> Scored:
    """Scores [N, n] / [N, n, width] of N trajectories [N, n] from their per-position readouts.

    A row may have fewer readouts than positions (an output that stopped at EOS: no readout after
    its end); its later positions hold placeholders (0, ids -1, -inf) for `protocol.pad_scored`."""
    tokens = np.asarray(tokens)
    N, n = tokens.shape
    out = Scored(np.zeros((N, n), np.float32), np.full((N, n, width), -1, np.int32),
                 np.full((N, n, width), NEG_INF, np.float32))
    for i, (r, row) in enumerate(zip(readouts, tokens)):
        if len(r) > n:
            raise ValueError(f"row {i}: {len(r)} readouts for {n} positions")
        for full, part in zip(out, score_trajectory(r, row[:len(r)], k, banned_ids, width)):
            full[i, :len(r)] = part
    return out
