"""The contract between the campaign runner and the engine workers (numpy + tvjax.pools.store only).

A job is a JSON file naming one engine configuration, one pool and a list of tasks that the worker
runs in a single engine session:

    {"engine": {...engine config...}, "pool": "/path/to/pool",
     "messages": [{"role": "system", "content": ...}, {"role": "user", "content": ...}],
     "scoring": "replay" | "sequence", "readout_width": 20,
     "tasks": [{"op": "sample", "side": "pi"}, {"op": "score", "side": "mu"}, ...]}

"sample" draws the side's N trajectories of length n (one shard); "score" writes the engine's R
scoring passes over the side's trajectories (one shard per pass); `task_shard_keys` names them, for
the worker and the campaign alike. A task whose shards are committed is skipped, so a killed job
resumes where it stopped. The engine config's `name` is its scorer name
in the pool; its `seed` is the base seed of the side it samples.

EOS (engine config key `eos`, `Eos`): "suppress" (the default, the paper's protocol) gives the EOS
ids no mass, so every trajectory has exactly n tokens, in a fixed-length pool; "stop" lets EOS be
sampled and ends a row at its first EOS id, in a pool created with those `eos_ids` (tvjax.pools.store):
the row is padded with eos_ids[0] to n, its length is stored, the EOS step is scored like any other
(EOS not banned: its probability is part of the record) and every position after it is the
deterministic pad (`pad_scored`). An engine whose mode or EOS ids differ from the pool's is refused
before it writes anything (`check_eos`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from tvjax.pools import store as pools

SCORINGS = ("replay", "sequence")
EOS_MODES = ("suppress", "stop")


class Eos(NamedTuple):
    """How an engine session treats its model's EOS ids (sorted): mode "suppress" bans them at every
    step; mode "stop" lets them be drawn and ends a row at the first one, padded with `pad`."""

    mode: str
    ids: tuple[int, ...]

    @property
    def stops(self) -> bool:
        return self.mode == "stop"

    @property
    def banned(self) -> list[int]:
        """The ids that get -inf before truncation: all EOS ids under "suppress", none under "stop"."""
        return [] if self.stops else list(self.ids)

    @property
    def pad(self) -> int:
        """The token after a stopped row's end (the pool's pad: the smallest EOS id)."""
        return self.ids[0]

    def lengths(self, tokens) -> np.ndarray:
        """int32 [N]: real positions of trajectories [N, n] (n throughout under "suppress")."""
        tokens = np.asarray(tokens)
        if self.stops:
            return pools.stopped_lengths(tokens, self.ids)
        return np.full(tokens.shape[0], tokens.shape[1], np.int32)


def eos_policy(config: dict, ids) -> Eos:
    """The Eos of an engine config (key `eos`, default "suppress") for the model's EOS ids."""
    mode = config.get("eos") or "suppress"
    if mode not in EOS_MODES:
        raise ValueError(f"engine config eos must be one of {EOS_MODES}, got {mode!r}")
    ids = tuple(sorted({int(i) for i in ids}))
    if not ids:
        raise EngineError(f"eos={mode} needs the model's EOS ids, and it declares none")
    return Eos(mode, ids)


class Sampled(NamedTuple):
    """tokens: int [N, n]; logprobs: float32 [N, n] the engine's own log-probability of each sampled
    token at sampling time (after top-k, temperature 1); lengths: int32 [N] real positions of each
    row under eos="stop" (tokens after a row's end are the pad, their log-probability 0), None under
    "suppress" (every row has n tokens). Bridges build it with `collect_sampled`."""

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray | None = None


class Scored(NamedTuple):
    """logprobs: float32 [N, n] realized-token draws (-inf = zero mass); topk_ids: int [N, n, w] and
    topk_logprobs: float32 [N, n, w] the renormalized top-w readout of every step."""

    logprobs: np.ndarray
    topk_ids: np.ndarray
    topk_logprobs: np.ndarray


class Bridge(Protocol):
    """What every engine bridge provides (one instance = one engine session). `tokenizer` is the
    engine's own tokenizer: the prompt is chat-templated by it (tvjax.engines.tokens.prompt_ids)."""

    tokenizer: Any
    eos: Eos  # the engine config's `eos` mode and the model's EOS ids

    def sample(self, prompt_ids: list[int], num: int, n: int, seed: int) -> Sampled: ...

    def replay(self, prompt_ids: list[int], tokens: np.ndarray, seed: int) -> Scored: ...

    def sequence_score(self, prompt_ids: list[int], tokens: np.ndarray) -> Scored: ...

    def describe(self) -> dict: ...

    def close(self) -> None: ...


class EngineError(RuntimeError):
    """An engine did something the measurement cannot accept (forcing failed, short output, ...)."""


def collect_sampled(rows, values, n: int, eos: Eos) -> Sampled:
    """A Sampled from an engine's per-row outputs: token ids and their sampling-time log-probs
    (sequences of equal length per row; rows may differ in length).

    eos="suppress": every row has exactly n tokens and none is an EOS id. eos="stop": a row ends at
    its first EOS id (included; whatever an engine appended after it, e.g. generate's padding, is
    dropped) or has n tokens without one; it is padded with eos.pad (log-prob 0) to n, and its
    length is recorded."""
    tokens = np.full((len(rows), n), eos.pad, np.int32)
    logprobs = np.zeros((len(rows), n), np.float32)
    for i, (row, lp) in enumerate(zip(rows, values)):
        row, lp = np.asarray(row, np.int64).ravel(), np.asarray(lp, np.float32).ravel()
        if len(row) != len(lp):
            raise EngineError(f"row {i}: {len(row)} tokens but {len(lp)} log-probabilities")
        hits = np.flatnonzero(np.isin(row, eos.ids)) if eos.stops else np.zeros(0, np.int64)
        end = int(hits[0]) + 1 if hits.size else len(row)
        if end > n or (not hits.size and len(row) != n):
            raise EngineError(f"row {i}: the engine returned {len(row)} tokens, expected "
                              + (f"at most {n} ending at an EOS id {list(eos.ids)}, or {n}" if eos.stops
                                 else f"{n} (EOS not suppressed?)"))
        tokens[i, :end], logprobs[i, :end] = row[:end], lp[:end]
    if not eos.stops:
        if np.isin(tokens, eos.ids).any():
            raise EngineError(f"an engine sampled an EOS id {list(eos.ids)} under eos=suppress")
        return Sampled(tokens, logprobs)
    return Sampled(tokens, logprobs, eos.lengths(tokens))


def check_replayed(rows, tokens, eos: Eos) -> None:
    """Forcing check: every replayed row (a sequence; an engine that stopped a request at EOS
    returns it up to there, one that ran on returns its padding after it) equals its trajectory up
    to the trajectory's length."""
    tokens = np.asarray(tokens)
    if len(rows) != len(tokens):
        raise EngineError(f"forcing failed: {len(rows)} replayed rows for {len(tokens)} trajectories")
    for row, target, length in zip(rows, tokens, eos.lengths(tokens)):
        row = np.asarray(row).ravel()
        if len(row) < length or not np.array_equal(row[:length], target[:length]):
            raise EngineError("forcing failed: the replayed tokens differ from the trajectory")


def pad_scored(scored: Scored, lengths, pad: int) -> Scored:
    """A Scored whose positions after each row's end are the deterministic pad (pools.pad_stopped):
    what a bridge computed there under eos="stop" (placeholders, or scores of a context past EOS)
    is replaced."""
    return Scored(*pools.pad_stopped(lengths, pad, scored.logprobs, scored.topk_ids, scored.topk_logprobs))


def check_eos(spec: pools.PoolSpec, name: str, eos: Eos) -> None:
    """Refuse an engine whose EOS treatment differs from the pool's (before it writes anything)."""
    if eos.stops and not spec.stops:
        raise EngineError(f"engine {name!r} runs with eos=stop but the pool stores no lengths: create it with "
                          f"eos_ids (e.g. {list(eos.ids)}), or run the engine with eos=suppress")
    if not eos.stops and spec.stops:
        raise EngineError(f"engine {name!r} runs with eos=suppress but the pool's outputs stop at EOS ids "
                          f"{list(spec.eos_ids)}: run it with eos=stop, or use a fixed-length pool")
    if eos.stops and tuple(eos.ids) != tuple(spec.eos_ids):
        raise EngineError(f"engine {name!r} has EOS ids {list(eos.ids)}, the pool's are {list(spec.eos_ids)}: "
                          "two sides with different EOS tokens cannot be compared")


def derive_seed(*parts: int) -> int:
    """A 31-bit seed derived from integers: independent streams for (base seed, side, pass, row)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def pass_seed(base_seed: int, side: str, pass_index: int) -> int:
    """Seed of replay pass `pass_index` over `side` by an engine whose base seed is `base_seed`."""
    return derive_seed(base_seed, pools.SIDES.index(side), pass_index + 1)


def load_job(path: str | Path) -> dict:
    job = json.loads(Path(path).read_text())
    for key in ("engine", "pool", "messages", "tasks"):
        if key not in job:
            raise ValueError(f"job {path}: missing {key!r}")
    if job.setdefault("scoring", "replay") not in SCORINGS:
        raise ValueError(f"job {path}: scoring must be one of {SCORINGS}, got {job['scoring']!r}")
    for field in ("name", "kind", "seed"):
        if field not in job["engine"]:
            raise ValueError(f"job {path}: engine config lacks {field!r}")
    return job


def check_prompt(writer: pools.PoolWriter, prompt_ids: list[int]) -> None:
    """Record the prompt's token ids in the pool, or refuse an engine whose chat template differs."""
    stored = writer.metadata.get("prompt_token_ids")
    if stored is None:
        writer.update_metadata(prompt_token_ids=list(map(int, prompt_ids)))
    elif list(stored) != list(prompt_ids):
        raise EngineError(f"this engine's chat-templated prompt {prompt_ids} differs from the pool's {stored}")


def check_scored(scored: Scored, tokens: np.ndarray, width: int) -> None:
    """Shapes, no NaN, log-probabilities <= 0 (up to rounding)."""
    N, n = tokens.shape
    if scored.logprobs.shape != (N, n) or scored.topk_ids.shape != (N, n, width):
        raise EngineError(f"scored shapes {scored.logprobs.shape}, {scored.topk_ids.shape} "
                          f"do not match tokens {tokens.shape} and readout width {width}")
    if np.isnan(scored.logprobs).any() or np.isnan(scored.topk_logprobs).any():
        raise EngineError("an engine returned NaN log-probabilities")
    if (scored.logprobs > 1e-4).any():
        raise EngineError(f"log-probabilities above 0: max {scored.logprobs.max()}")


def emit(event: str, **fields) -> None:
    """One JSON line on stdout: how the campaign follows a worker's progress."""
    print(json.dumps({"event": event, **fields}), flush=True)


class ShardTimer:
    def __init__(self):
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return round(time.perf_counter() - self.start, 3)


def task_shard_keys(task: dict, scorer: str, spec: pools.PoolSpec) -> list[str]:
    """Keys of the shards a task commits, in order: a sample task one (all N rows of its side), a
    score task one per pass j (all N rows, pass j, under `scorer`, the engine's name)."""
    side, N = task["side"], spec.num_per_side
    if task["op"] == "sample":
        return [pools.tokens_key(side, 0, N)]
    if task["op"] == "score":
        return [pools.draws_key(side, scorer, 0, N, j, j + 1) for j in range(spec.repeats)]
    raise ValueError(f"unknown task op {task['op']!r}")


def run_tasks(job: dict, bridge: Bridge, prompt_ids: list[int]) -> None:
    """Run a job's tasks on an open bridge, committing one shard per sample task and per pass.
    `prompt_ids`: the job's messages as chat-templated by the bridge's tokenizer."""
    writer = pools.open_pool_writer(job["pool"])
    spec, engine = writer.spec, job["engine"]
    name, width = engine["name"], spec.top_k
    if width is None:
        raise EngineError("engine pools store a top-k readout: create the pool with top_k set")
    if name not in spec.scorers:
        raise EngineError(f"engine name {name!r} is not a scorer of the pool ({spec.scorers})")
    check_eos(spec, name, bridge.eos)
    check_prompt(writer, prompt_ids)
    for task in job["tasks"]:
        keys = task_shard_keys(task, name, spec)
        if task["op"] == "sample":
            _sample_task(writer, bridge, prompt_ids, task["side"], int(engine["seed"]), keys[0])
        else:
            _score_task(writer, bridge, prompt_ids, job, task["side"], width, keys)
    emit("job_done", engine=name)


def _sample_task(writer, bridge, prompt_ids, side, seed, key) -> None:
    spec = writer.spec
    if writer.is_done(key):
        emit("skip", key=key)
        return
    timer = ShardTimer()
    sampled = bridge.sample(prompt_ids, spec.num_per_side, spec.n, seed)
    if sampled.tokens.shape != (spec.num_per_side, spec.n):
        raise EngineError(f"sampled tokens of shape {sampled.tokens.shape}, expected {(spec.num_per_side, spec.n)}")
    if not np.isfinite(sampled.logprobs).all():
        raise EngineError("an engine reported zero mass for a token it sampled itself")
    if (sampled.lengths is not None) != spec.stops:
        raise EngineError(f"the engine returned {'no ' if sampled.lengths is None else ''}lengths for a "
                          f"{'stopping' if spec.stops else 'fixed-length'} pool")
    writer.write_tokens(side, 0, sampled.tokens, sample_logprobs=sampled.logprobs if spec.sample_logprobs else None,
                        lengths=sampled.lengths)
    emit("shard", key=key, seconds=timer.seconds())


def _score_task(writer, bridge, prompt_ids, job, side, width, keys) -> None:
    engine, spec = job["engine"], writer.spec
    tokens = pools.read_tokens(writer.path, side)
    lengths = pools.read_lengths(writer.path, side) if spec.stops else None
    for j, key in enumerate(keys):
        if writer.is_done(key):
            emit("skip", key=key)
            continue
        timer = ShardTimer()
        if job["scoring"] == "replay":
            scored = bridge.replay(prompt_ids, tokens, pass_seed(int(engine["seed"]), side, j))
        else:
            scored = bridge.sequence_score(prompt_ids, tokens)
        if lengths is not None:
            scored = pad_scored(scored, lengths, spec.eos_ids[0])
        check_scored(scored, tokens, width)
        writer.write_draws(side, engine["name"], 0, j, scored.logprobs[:, :, None],
                           topk_ids=scored.topk_ids[:, :, None, :], topk_logprobs=scored.topk_logprobs[:, :, None, :])
        emit("shard", key=key, seconds=timer.seconds())
