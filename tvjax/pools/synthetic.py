"""Pools from synthetic processes: the JAX side's own engine, writing what real engines write
(realized-token draws and top-k readouts) from core instances and oracles, with known truth.

Every shard's draws come from a key folded from (side, scorer, row chunk), so a killed writer that
is called again with the same arguments skips committed shards and regenerates the others
identically: the finished pool does not depend on where it was interrupted.
"""

from functools import partial

import jax
import numpy as np

from tvjax.pools.store import SIDES, PoolWriter, create_pool, draws_key, pad_stopped, stopped_lengths, tokens_key


def _as_logprobs(probs: np.ndarray, what: str) -> np.ndarray:
    probs = np.asarray(probs, np.float64)
    if np.any(probs < 0) or np.any(np.isnan(probs)):
        raise ValueError(f"{what}: the oracle drew {int(np.sum(probs < 0))} negative probabilities; a pool "
                         "stores log-probabilities (as engines return them), so lower sigma or use an "
                         "instance whose smallest realized probability is well above sigma^2")
    with np.errstate(divide="ignore"):
        return np.log(probs).astype(np.float32)


def _draw_block(key, process, oracle, tokens, repeats: int, top_k: int | None, what: str):
    """(logprobs [c, n, R], topk ids [c, n, R, k] or None, topk logprobs or None) for one row chunk."""
    if top_k is None:
        return _as_logprobs(oracle.draw_probs(key, process, tokens, repeats), what), None, None
    dists = np.asarray(oracle.draw_distributions(key, process, tokens, repeats), np.float64)
    realized = np.take_along_axis(dists, np.asarray(tokens)[:, :, None, None], axis=-1)[..., 0]
    ids = np.argsort(-dists, axis=-1, kind="stable")[..., :top_k]
    top = np.take_along_axis(dists, ids, axis=-1)
    return _as_logprobs(realized, what), ids.astype(np.int32), _as_logprobs(top, what + " top-k")


def _describe(process) -> str:
    construction = getattr(process, "construction", None)
    extra = f", construction={construction}" if construction is not None else ""
    return f"{type(process).__name__}(n={process.n}, vocab_size={process.vocab_size}{extra})"


def write_synthetic_pool(key, path, pi, mu, oracle, *, num_per_side: int, repeats: int,
                         top_k: int | None = None, extra_scorers: dict | None = None, row_chunk: int = 256,
                         metadata: dict | None = None) -> PoolWriter:
    """Sample num_per_side trajectories from pi and from mu, score each with R passes of every
    scorer, and write (or resume) the pool at `path`.

    oracle: one core oracle for both models, or {"pi": oracle, "mu": oracle}. extra_scorers:
    {name: (process, oracle)} scored on both sides too (e.g. a biased scoring API). top_k: store the
    top-k ids/log-probs of full next-token distribution draws (their realized coordinate is the
    stored draw). metadata: extra entries, e.g. {"exact_tv": tvjax.exact_tv(pi, mu)} (shown by the
    report) or {"comparison_pairs": [["pi", "mu_api"]]}. A pair whose outputs stop at EOS
    (`eos_ids`, e.g. `stopping_tabular_pair`) writes a stopping pool: lengths with the tokens, and
    every draw after a row's EOS the deterministic pad, as an engine's replay writes it.
    Returns the writer of the completed pool.
    """
    oracles = oracle if isinstance(oracle, dict) else {"pi": oracle, "mu": oracle}
    if set(oracles) != {"pi", "mu"}:
        raise ValueError(f"oracle dict must have keys 'pi' and 'mu', got {sorted(oracles)}")
    scorers = {"pi": (pi, oracles["pi"]), "mu": (mu, oracles["mu"]), **(extra_scorers or {})}
    if top_k is not None and top_k > pi.vocab_size:
        raise ValueError(f"top_k={top_k} exceeds the vocabulary size {pi.vocab_size}")
    eos_ids = tuple(getattr(pi, "eos_ids", ()))
    if tuple(getattr(mu, "eos_ids", ())) != eos_ids:
        raise ValueError(f"pi and mu stop at different EOS ids ({eos_ids} vs {tuple(getattr(mu, 'eos_ids', ()))})")
    key_pi, key_mu, key_draws = jax.random.split(key, 3)
    meta = {"engine": "synthetic", "engine_version": "tvjax", "model": {"pi": _describe(pi), "mu": _describe(mu)},
            "oracles": {name: repr(o) for name, (_, o) in scorers.items()}, "dtype": "float32",
            "temperature": 1.0, "seeds": {"key": np.asarray(jax.random.key_data(key)).tolist()},
            "batch_construction": f"row chunks of {row_chunk}, all passes per shard", **(metadata or {})}
    writer = create_pool(path, n=pi.n, num_per_side=num_per_side, repeats=repeats, scorers=tuple(scorers),
                         samplers=("pi", "mu"), top_k=top_k, sample_logprobs=True, metadata=meta,
                         row_chunk=row_chunk, pass_chunk=repeats, exist_ok=True, eos_ids=eos_ids)
    for i, (side, process, side_key) in enumerate(zip(SIDES, (pi, mu), (key_pi, key_mu))):
        tokens = process.sample(side_key, num_per_side)
        for start in range(0, num_per_side, row_chunk):
            rows = np.asarray(tokens[start:start + row_chunk])
            stop = start + rows.shape[0]
            lengths = stopped_lengths(rows, eos_ids) if eos_ids else None
            pad = partial(pad_stopped, lengths, eos_ids[0]) if eos_ids else (lambda *arrays: arrays)
            if not writer.is_done(tokens_key(side, start, stop)):
                sample_logprobs = np.asarray(process.path_logprobs(rows))
                writer.write_tokens(side, start, rows, pad(sample_logprobs)[0], lengths=lengths)
            for j, (name, (scorer, orc)) in enumerate(scorers.items()):
                if writer.is_done(draws_key(side, name, start, stop, 0, repeats)):
                    continue
                shard_key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key_draws, i), j), start)
                lp, ids, tlp = pad(*_draw_block(shard_key, scorer, orc, rows, repeats, top_k, f"{side}/{name}"))
                writer.write_draws(side, name, start, 0, lp, topk_ids=ids, topk_logprobs=tlp)
    return writer
