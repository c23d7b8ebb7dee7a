"""A text endpoint's answers as target calls of the reference audit, and the grey-box test.

Text-only: an answer is a string and a finish_reason. It becomes the reference's token ids by
encoding the text with the reference tokenizer, then EOS when the answer stopped ("stop") and
fits, cut at n = max_tokens and padded with the first EOS id (the pad of eos="stop"). Reference
continuations go through the same map (`canonical_rows`: decode up to EOS, encode again), so the
two sides of every rank are one function of a continuation and the null stays exact even where a
text's canonical encoding differs from the sampled ids.

Grey-box: where the endpoint also returns the log-probability of each sampled token (OpenAI
`logprobs`), the per-call deviation D = mean_t |log p_target(x_t) - log p_ref(x_t)| measures how
far its numbers are from the reference's exact ones. Serving is not bit-reproducible (batching,
kernels), so D is compared with the same deviation of a second deployment of the authentic model
(the noise floor: the reference served again, e.g. a local vLLM), not with zero: the one-sided
Mann-Whitney test of target D above floor D.
"""

from typing import NamedTuple

import numpy as np
from scipy.stats import mannwhitneyu

from tvjax.audit.reference.audit import TargetCalls
from tvjax.audit.reference.scores import chunk_rows, in_chunks
from tvjax.core.currency import trajectory_lengths
from tvjax.core.validate import check_positive_int

LENGTH_MISMATCH_LIMIT = 0.5  # share of answers cut at max_tokens that may re-encode to another length


def text_rows(tokenizer, texts, stopped, n, eos_ids):
    """int32 [N, n]: each text encoded, EOS after it where it stopped, cut at n, EOS-padded."""
    n = check_positive_int("n", n)
    if not eos_ids:
        raise ValueError("text answers need the reference's EOS ids (an answer that stops ends in EOS)")
    rows = np.full((len(texts), n), eos_ids[0], np.int32)
    for row, (text, stop) in enumerate(zip(texts, stopped)):
        if not isinstance(text, str):
            raise ValueError(f"answer {row} is not text: {type(text).__name__}")
        ids = list(tokenizer.encode(text)) + ([eos_ids[0]] if stop else [])
        ids = ids[:n]
        rows[row, : len(ids)] = ids
    return rows


def decode_rows(tokenizer, tokens, eos_ids):
    """(texts, stopped) of continuations tokens [N, n]: each row up to its first EOS, decoded as
    an endpoint decodes it, special tokens left out (vLLM's and the OpenAI API's default: a
    sampled special token is in the tokens but not in the text)."""
    tokens = np.asarray(tokens)
    lengths = np.asarray(trajectory_lengths(tokens, tuple(eos_ids)))
    texts, stopped = [], []
    for row, length in zip(tokens, lengths):
        real = [int(t) for t in row[:length]]
        stop = bool(real) and real[-1] in eos_ids
        texts.append(tokenizer.tokenizer.decode(real[:-1] if stop else real, skip_special_tokens=True))
        stopped.append(stop)
    return texts, stopped


def canonical_rows(tokenizer, n, eos_ids):
    """The map tokens [k, n] -> tokens [k, n] that reference continuations take: decode, encode
    (`text_rows`): what an endpoint's answer goes through."""
    eos_ids = tuple(eos_ids)

    def canonical(tokens):
        texts, stopped = decode_rows(tokenizer, tokens, eos_ids)
        return text_rows(tokenizer, texts, stopped, n, eos_ids)

    return canonical


def check_tokenizer_fit(tokenizer, texts, finish_reasons, n):
    """A ValueError when most answers cut at max_tokens = n re-encode to another length: the
    endpoint's tokenizer is not the reference's (the audit would compare other token streams)."""
    cut = [text for text, reason in zip(texts, finish_reasons) if reason == "length"]
    if len(cut) < 10:
        return
    lengths = np.array([len(tokenizer.encode(text)) for text in cut])
    off = float(np.mean(lengths != n))
    if off > LENGTH_MISMATCH_LIMIT:
        raise ValueError(f"{100 * off:.0f}% of the {len(cut)} answers cut at max_tokens={n} re-encode with the "
                         f"reference tokenizer to another length (median {int(np.median(lengths))}): the endpoint "
                         "serves a model with another tokenizer, or max_tokens is not the reference's n")


def endpoint_calls(tokenizer, answers, n, eos_ids):
    """TargetCalls of endpoint answers (`tvjax.engines.answers.Answer`: prompt, text, finish_reason)."""
    if not answers:
        raise ValueError("no answers")
    texts = [a.text for a in answers]
    reasons = [a.finish_reason for a in answers]
    unknown = sorted({r for r in reasons if r not in ("stop", "length")})
    if unknown:
        raise ValueError(f"answers finished for reasons the audit cannot place: {unknown} (want 'stop' at EOS or "
                         "'length' at max_tokens; a stop string or a content filter changes the distribution)")
    check_tokenizer_fit(tokenizer, texts, reasons, n)
    tokens = text_rows(tokenizer, texts, [r == "stop" for r in reasons], n, tuple(eos_ids))
    return TargetCalls(tokens, np.array([a.prompt for a in answers], np.int64))


# --------------------------------------------------------------------------- grey-box


def reported_token_ids(tokenizer, tokens):
    """Token ids of an answer's reported tokens: 'token_id:123' (vLLM, SGLang with
    return_tokens_as_token_ids) or a string that the tokenizer encodes as exactly one id."""
    ids = []
    for token in tokens:
        if token.startswith("token_id:"):
            ids.append(int(token[len("token_id:"):]))
            continue
        encoded = list(tokenizer.encode(token))
        if len(encoded) != 1:
            raise ValueError(f"the reported token {token!r} is not one reference token ({encoded}): ask the endpoint "
                             "for token ids (return_tokens_as_token_ids) or use the text-only audit")
        ids.append(encoded[0])
    return ids


def reported_rows(tokenizer, answers, n, eos_ids):
    """(tokens int32 [N, n], reported log-probs float64 [N, n], lengths [N]) of grey-box answers:
    the sampled ids as reported (EOS appended where the answer stopped, with its reported
    log-prob when the endpoint gives one, else left out of the deviation), cut at n."""
    eos = tuple(eos_ids)[0]
    tokens = np.full((len(answers), n), eos, np.int32)
    reported = np.full((len(answers), n), np.nan)
    lengths = np.zeros(len(answers), np.int32)
    for row, answer in enumerate(answers):
        if answer.tokens is None or answer.logprobs is None:
            raise ValueError(f"answer {row} has no reported log-probs: collect with top_logprobs for the grey-box mode")
        ids = reported_token_ids(tokenizer, answer.tokens)[:n]
        tokens[row, : len(ids)] = ids
        reported[row, : len(ids)] = answer.logprobs[: len(ids)]
        lengths[row] = len(ids)
        if answer.finish_reason == "stop" and len(ids) < n and (not ids or ids[-1] != eos):
            tokens[row, len(ids)] = eos
            lengths[row] = len(ids) + 1
    return tokens, reported, lengths


def call_deviations(reference_logprobs, reported, lengths):
    """float [N]: mean over the positions with a reported log-prob of |reported - reference|
    (a -inf on one side only counts as the largest finite deviation seen, 50 nats at least)."""
    reference_logprobs, reported = np.asarray(reference_logprobs, np.float64), np.asarray(reported, np.float64)
    n = reported.shape[1]
    use = (np.arange(n)[None, :] < np.asarray(lengths)[:, None]) & ~np.isnan(reported)
    gap = np.abs(reported - reference_logprobs)
    finite = gap[use & np.isfinite(gap)]
    cap = max(50.0, float(finite.max()) if finite.size else 0.0)
    both_impossible = np.isneginf(reported) & np.isneginf(reference_logprobs)
    gap = np.where(both_impossible, 0.0, np.where(np.isfinite(gap), gap, cap))
    counts = use.sum(axis=1)
    if (counts == 0).any():
        raise ValueError(f"{int((counts == 0).sum())} answers have no reported log-prob at any position")
    return np.where(use, gap, 0.0).sum(axis=1) / counts


class GreyBoxResult(NamedTuple):
    """pvalue: one-sided Mann-Whitney of the target's deviations above the floor's; the medians
    of both (nats per token) and their counts."""

    pvalue: float
    target_median: float
    floor_median: float
    calls: int
    floor_calls: int


def greybox_test(target_deviations, floor_deviations):
    """Are the target's deviations from the reference larger than the noise floor's?"""
    target, floor = np.asarray(target_deviations, np.float64), np.asarray(floor_deviations, np.float64)
    if target.size < 2 or floor.size < 2:
        raise ValueError(f"the grey-box test needs at least 2 deviations per side, got {target.size} and {floor.size}")
    if np.isnan(target).any() or np.isnan(floor).any():
        raise ValueError("deviations hold NaN")
    pvalue = float(mannwhitneyu(target, floor, alternative="greater").pvalue)
    return GreyBoxResult(pvalue, float(np.median(target)), float(np.median(floor)), int(target.size), int(floor.size))


def greybox_deviations(references, prompts, tokens, reported, lengths):
    """call_deviations of reported log-probs against each call's reference's exact ones."""
    tokens, prompts = np.asarray(tokens, np.int32), np.asarray(prompts)
    exact = np.zeros(tokens.shape)
    for p in np.unique(prompts):
        rows = np.flatnonzero(prompts == p)
        process = references[int(p)]
        exact[rows] = in_chunks(process.path_logprobs, tokens[rows], chunk_rows(process, rows.size))
    return call_deviations(exact, reported, lengths)
