"""Replay-scoring arithmetic shared by every engine bridge (paper appendix B.5), in plain torch.

One engine step of the replay oracle, for a batch of rows of raw next-token logits:

1. ``suppress``: the banned tokens (the EOS ids under eos=suppress, fixed-length sampling; none under
   eos=stop, where the EOS token's probability is recorded like any other) get -inf, before any
   truncation;
2. ``topk_logprobs``: log-softmax renormalized over the tie-inclusive top-k set (every token whose
   logit is >= the k-th largest), -inf outside it. This is the distribution the engine samples from
   at temperature 1, and so one draw of the next-token distribution;
3. ``realized``: the log-probability of the trajectory's token in it (-inf when it is outside the
   step's top-k: a zero-mass draw, never a NaN);
4. ``force``: the logits are replaced by a one-hot mask on the trajectory's token, so the engine
   decodes along the given trajectory through its ordinary decode path.

The values are recorded BEFORE the forcing: what an engine reports as log-probabilities is computed
after its logits processors and is contaminated by the forcing.

`tvjax.engines.readouts` does the same renormalization, in numpy, for engines that only expose a
top-K list of log-probabilities (sequence-level prompt log-probs, OpenAI-compatible servers).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tvjax._extras import require
from tvjax.engines.protocol import Scored

torch = require("torch", "engines", "the torch-side engine bridges")

NEG_INF = float("-inf")


class StepRecord(NamedTuple):
    """What one replay step records for a batch of B rows (all float32 / int64, on the logits' device).

    realized: [B] log-probability of the target token under the renormalized top-k distribution;
    topk_ids: [B, w] ids of the w most likely tokens (sorted, w = readout width);
    topk_logprobs: [B, w] their renormalized log-probabilities (-inf beyond the support).
    """

    realized: torch.Tensor
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor


def stack(records: list[StepRecord], axis: int) -> StepRecord:
    """Records of consecutive steps (or rows) stacked along `axis`."""
    return StepRecord(*(torch.stack(parts, axis) for parts in zip(*records)))


def to_scored(record: StepRecord) -> Scored:
    """A record holding [N, n] / [N, n, w] tensors as the numpy arrays of a pool shard."""
    return Scored(record.realized.cpu().numpy().astype(np.float32),
                  record.topk_ids.cpu().numpy().astype(np.int32),
                  record.topk_logprobs.cpu().numpy().astype(np.float32))


def pad_steps(record: StepRecord, n: int, axis: int = 0) -> StepRecord:
    """A record of the first m <= n steps (steps along `axis`) cut or extended to n steps; the added
    steps hold placeholders (realized 0, ids 0, log-probs -inf): they are the steps after an output
    stopped at EOS, which `protocol.pad_scored` replaces by the pad."""
    m = record.realized.shape[axis]
    if m >= n:
        return StepRecord(*(t.narrow(axis, 0, n) for t in record))

    def extend(t, fill):
        shape = list(t.shape)
        shape[axis] = n - m
        return torch.cat([t, torch.full(shape, fill, dtype=t.dtype, device=t.device)], axis)

    return StepRecord(extend(record.realized, 0.0), extend(record.topk_ids, 0), extend(record.topk_logprobs, NEG_INF))


def suppress(logits: torch.Tensor, banned_ids) -> torch.Tensor:
    """logits [B, V] with the columns of `banned_ids` set to -inf (a new tensor)."""
    out = logits.clone()
    if len(banned_ids):
        out[..., list(banned_ids)] = NEG_INF
    return out


def topk_mask(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """bool [B, V]: the tie-inclusive top-k set of every row (all finite entries when k is None).

    A row keeps every token whose logit is >= its k-th largest logit, as vLLM's, SGLang's and
    transformers' top-k samplers do, so ties at the boundary make the set larger than k.
    """
    finite = torch.isfinite(logits)
    if k is None or k >= logits.shape[-1]:
        return finite
    if k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {k}")
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return (logits >= kth) & finite


def topk_logprobs(logits: torch.Tensor, k: int | None) -> torch.Tensor:
    """float32 [B, V]: log-softmax renormalized over each row's tie-inclusive top-k set, -inf outside."""
    logits = logits.float()
    if not torch.isfinite(logits).any(dim=-1).all():
        raise ValueError("a logits row has no finite entry: nothing can be sampled from it")
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN")
    masked = logits.masked_fill(~topk_mask(logits, k), NEG_INF)
    return torch.log_softmax(masked, dim=-1)


def realized(logprobs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[B]: logprobs[b, tokens[b]] (-inf when the token is outside the row's support)."""
    return logprobs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def readout(logprobs: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, width], logprobs [B, width]) of the `width` most likely tokens of every row, sorted."""
    values, ids = torch.topk(logprobs, min(width, logprobs.shape[-1]), dim=-1)
    return ids, values


def force(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, V] replaced by 0 at targets[b] and -inf elsewhere (a new tensor, same dtype)."""
    out = torch.full_like(logits, NEG_INF)
    out.scatter_(-1, targets.long().unsqueeze(-1), 0.0)
    return out


def replay_step(logits: torch.Tensor, targets: torch.Tensor, k: int | None, banned_ids,
                width: int) -> tuple[StepRecord, torch.Tensor]:
    """One replay step: (record taken before forcing, forced logits)."""
    logprobs = topk_logprobs(suppress(logits, banned_ids), k)
    ids, values = readout(logprobs, width)
    return StepRecord(realized(logprobs, targets), ids, values), force(logits, targets)


def lookup(topk_ids: torch.Tensor, topk_logprobs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[...]: the readout log-probability of `tokens` (-inf when a token is not in the readout).

    Exact for a sampled token whenever the readout width >= k (ties at the top-k boundary aside):
    used where an engine only reveals which token it sampled after the step was recorded.
    """
    hit = topk_ids == tokens.long().unsqueeze(-1)
    values = torch.where(hit, topk_logprobs.float(), torch.full_like(topk_logprobs.float(), NEG_INF))
    return values.max(dim=-1).values
