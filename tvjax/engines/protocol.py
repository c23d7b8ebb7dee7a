"""The contract between the campaign runner and the engine workers (numpy + tvjax.pools only).

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
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from tvjax import pools

SCORINGS = ("replay", "sequence")


class Sampled(NamedTuple):
    """tokens: int [N, n]; logprobs: float32 [N, n] the engine's own log-probability of each sampled
    token at sampling time (after top-k, temperature 1)."""

    tokens: np.ndarray
    logprobs: np.ndarray


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

    def sample(self, prompt_ids: list[int], num: int, n: int, seed: int) -> Sampled: ...

    def replay(self, prompt_ids: list[int], tokens: np.ndarray, seed: int) -> Scored: ...

    def sequence_score(self, prompt_ids: list[int], tokens: np.ndarray) -> Scored: ...

    def describe(self) -> dict: ...

    def close(self) -> None: ...


class EngineError(RuntimeError):
    """An engine did something the measurement cannot accept (forcing failed, short output, ...)."""


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
    writer.write_tokens(side, 0, sampled.tokens, sample_logprobs=sampled.logprobs if spec.sample_logprobs else None)
    emit("shard", key=key, seconds=timer.seconds())


def _score_task(writer, bridge, prompt_ids, job, side, width, keys) -> None:
    engine = job["engine"]
    tokens = pools.read_tokens(writer.path, side)
    for j, key in enumerate(keys):
        if writer.is_done(key):
            emit("skip", key=key)
            continue
        timer = ShardTimer()
        if job["scoring"] == "replay":
            scored = bridge.replay(prompt_ids, tokens, pass_seed(int(engine["seed"]), side, j))
        else:
            scored = bridge.sequence_score(prompt_ids, tokens)
        check_scored(scored, tokens, width)
        writer.write_draws(side, engine["name"], 0, j, scored.logprobs[:, :, None],
                           topk_ids=scored.topk_ids[:, :, None, :], topk_logprobs=scored.topk_logprobs[:, :, None, :])
        emit("shard", key=key, seconds=timer.seconds())
