"""Hydra app: measure TV between two engine configurations on a real model (paper section 5, B.1).

    .venv/bin/python experiments/engine_campaign.py [experiment=engine_fp32_vs_bf16] [key=value ...]
    .venv/bin/python experiments/engine_campaign.py experiment=engine_jax_vs_transformers   # tvjax.models vs HF

For the pair (pi, mu) it samples N trajectories per side, replay-scores both sides under both
engines (R passes each), writes one pool, and runs the pool report. Each engine runs in its own
subprocess (`python -m tvjax.engines.worker JOB.json`) with the Python of its own venv (the
engine config's `python`; the JAX engine, kind "jax", runs in the base venv). Jobs, in
order, each one engine session:

  1. pi: sample pi, score pi          (sampling and own-side scoring in one session)
  2. mu: sample mu, score mu, score pi
  3. pi: score mu

Every shard is committed atomically; rerunning with campaign.pool=<the pool> resumes a killed
campaign without redoing committed shards.

campaign.access=text (both engines kind openai: text-only chat endpoints, the access model of a
closed provider): N completions per side, no log-probabilities, kept in the answer stores texts/pi, texts/mu beside
campaign.pool (resumable), and tvjax.audit.distinguish's certified TV lower bound from them, bound.json.

campaign.eos (both engines' `eos`): "suppress" (default, the paper's protocol: EOS banned, n tokens
per trajectory, a fixed-length pool) or "stop" (outputs stop at their first EOS as served: the pool
is created with the model's EOS ids, found by `python -m tvjax.engines.worker --describe-eos` in
the pi engine's venv, and stores per-trajectory lengths; every engine session checks its own EOS
ids against the pool's). The metadata records `eos`, `eos_ids` and `eos_suppressed`.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from tvjax.engines.protocol import task_shard_keys
from tvjax.pools import store as pools

ROOT = Path(__file__).resolve().parents[1]
# engines that read safetensors folders, not GGUF files (transformers and jax read a GGUF directly)
CONVERTED_KINDS = ("vllm", "sglang")


class CampaignError(RuntimeError):
    """A worker failed or the configuration cannot produce a valid pool."""


def engine_config(cfg: DictConfig) -> dict:
    """A side's engine config as a plain dict, without the campaign-only 'python' key."""
    config = OmegaConf.to_container(cfg, resolve=True)
    config.pop("python")
    return config


def python_of(cfg: DictConfig) -> str:
    path = Path(cfg.python)
    return str(path if path.is_absolute() else ROOT / path)


def plan() -> list[tuple[str, list[dict]]]:
    """The three engine sessions of a campaign: (side whose engine runs, tasks)."""
    return [("pi", [{"op": "sample", "side": "pi"}, {"op": "score", "side": "pi"}]),
            ("mu", [{"op": "sample", "side": "mu"}, {"op": "score", "side": "mu"}, {"op": "score", "side": "pi"}]),
            ("pi", [{"op": "score", "side": "mu"}])]


def session_keys(tasks: list[dict], scorer: str, spec: pools.PoolSpec) -> list[str]:
    """Shard keys an engine session named `scorer` commits (the protocol's shard scheme)."""
    return [key for task in tasks for key in task_shard_keys(task, scorer, spec)]


EOS_MODES = ("suppress", "stop")


def eos_mode(cfg: DictConfig) -> str:
    """campaign.eos, checked against both engines' `eos` (a side overridden alone is refused)."""
    mode = cfg.campaign.get("eos", "suppress")
    if mode not in EOS_MODES:
        raise CampaignError(f"campaign.eos must be one of {EOS_MODES}, got {mode!r}")
    for side in ("pi", "mu"):
        if cfg[side].get("eos", "suppress") != mode:
            raise CampaignError(f"{side}.eos={cfg[side].get('eos')} but campaign.eos={mode}: both engines "
                                "must treat EOS alike (set campaign.eos)")
    return mode


def describe_eos(cfg: DictConfig, side: str, config: dict) -> list[int]:
    """The EOS ids of a side's model, from `tvjax.engines.worker --describe-eos` run in its engine's
    venv (the JAX side loads no tokenizer with transformers)."""
    out = subprocess.run([python_of(cfg[side]), "-m", "tvjax.engines.worker", "--describe-eos", json.dumps(config)],
                         cwd=ROOT, env=worker_env(), capture_output=True, text=True)
    if out.returncode != 0:
        raise CampaignError(f"finding the EOS ids of {side}'s model failed:\n{out.stderr[-3000:]}")
    ids = json.loads(out.stdout.strip().splitlines()[-1])["eos_ids"]
    if not ids:
        raise CampaignError(f"campaign.eos=stop, but {side}'s model declares no EOS id")
    return ids


def create_or_resume(cfg: DictConfig, names: tuple[str, str], width: int, eos_ids=()) -> pools.PoolWriter:
    """The campaign's pool: created, or reopened when campaign.pool exists with the same spec (a
    resume; a pool of another spec, e.g. another campaign.eos or other EOS ids, is refused)."""
    c = cfg.campaign
    mode = eos_mode(cfg)
    metadata = {"campaign": OmegaConf.to_container(c, resolve=True),
                "pi": engine_config(cfg.pi), "mu": engine_config(cfg.mu), "scoring": c.scoring,
                "temperature": 1.0, "eos": mode, "eos_ids": list(eos_ids), "eos_suppressed": mode == "suppress"}
    return pools.create_pool(c.pool, n=int(c.n), num_per_side=int(c.num_per_side), repeats=int(c.repeats),
                             scorers=names, samplers=names, top_k=width, sample_logprobs=True,
                             metadata=metadata, exist_ok=True, eos_ids=eos_ids)


def readout_width(cfg: DictConfig) -> int:
    if cfg.campaign.readout_width is not None:
        return int(cfg.campaign.readout_width)
    ks = [cfg[s].top_k for s in ("pi", "mu")]
    if any(k is None for k in ks):
        raise CampaignError("an engine without top_k needs an explicit campaign.readout_width")
    return int(max(ks))


def converted_model(cfg: DictConfig) -> str:
    """The model folder vLLM/SGLang read: a GGUF model is converted once (cached) by the
    transformers venv's Python; a model folder is used as it is."""
    if (Path(str(cfg.campaign.model)).expanduser() / "config.json").is_file():
        return str(Path(str(cfg.campaign.model)).expanduser())
    python = Path(cfg.campaign.convert_python)
    python = python if python.is_absolute() else ROOT / python
    out = subprocess.run([str(python), "-m", "tvjax.engines.models", "convert", str(cfg.campaign.model)],
                         env=worker_env(), capture_output=True, text=True)
    if out.returncode != 0:
        raise CampaignError(f"model conversion failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def worker_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def run_worker(python: str, job: dict, job_path: Path, log_path: Path, bar: tqdm) -> None:
    """Run one engine session; advance `bar` per committed/skipped shard; raise with the log's tail."""
    job_path.write_text(json.dumps(job, indent=1))
    tail = deque(maxlen=40)
    with open(log_path, "a", buffering=1) as log:
        proc = subprocess.Popen([python, "-m", "tvjax.engines.worker", str(job_path)], cwd=ROOT, env=worker_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            log.write(line)
            tail.append(line)
            event = parse_event(line)
            if event and event["event"] in ("shard", "skip"):
                bar.set_postfix_str(f"{job['engine']['name']}: {event['key']}")
                bar.update(1)
        code = proc.wait()
    if code != 0:
        raise CampaignError(f"worker {job['engine']['name']} exited with {code}; see {log_path}:\n" + "".join(tail))


def parse_event(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def run_campaign(cfg: DictConfig) -> Path:
    names = (cfg.pi.name, cfg.mu.name)
    if names[0] == names[1]:
        raise CampaignError(f"both engines are named {names[0]!r}: give pi.name and mu.name distinct values")
    models = {}

    def job_config(side: str) -> dict:
        """The side's engine config as its worker gets it (vLLM/SGLang read the converted folder)."""
        config = engine_config(cfg[side])
        if config["kind"] in CONVERTED_KINDS:
            models.setdefault("converted", converted_model(cfg))
            config["model"] = models["converted"]
        return config

    eos_ids = describe_eos(cfg, "pi", job_config("pi")) if eos_mode(cfg) == "stop" else ()
    writer = create_or_resume(cfg, names, readout_width(cfg), eos_ids)
    pool = Path(cfg.campaign.pool)
    jobs_dir = pool.parent / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    sessions = [(side, tasks, session_keys(tasks, cfg[side].name, writer.spec)) for side, tasks in plan()]
    done = writer.done_shards()
    with tqdm(total=sum(len(keys) for _, _, keys in sessions), desc="shards", unit="shard") as bar:
        for i, (side, tasks, keys) in enumerate(sessions):
            engine = cfg[side]
            if all(k in done for k in keys):
                bar.update(len(keys))
                continue
            config = job_config(side)
            job = {"engine": config, "pool": str(pool), "messages": OmegaConf.to_container(cfg.campaign.messages),
                   "scoring": cfg.campaign.scoring, "tasks": tasks}
            run_worker(python_of(engine), job, jobs_dir / f"{i}-{engine.name}.json",
                       jobs_dir / f"{i}-{engine.name}.log", bar)
    pools.open_pool_writer(pool).update_metadata(finished_at=datetime.datetime.now(datetime.timezone.utc).isoformat())
    return pool


def run_report(pool: Path, out: str) -> None:
    subprocess.run([sys.executable, "-m", "tvjax.pools.report", str(pool), "--out", out], cwd=ROOT, check=True)


def run_text_campaign(cfg: DictConfig) -> Path:
    """campaign.access=text: both engines are text-only chat endpoints (kind openai); each side's
    N completions (at most n tokens) go to the answer stores texts/pi and texts/mu beside campaign.pool, resumably, and
    `tvjax.audit.distinguish.distinguish_texts` certifies a TV lower bound from them (bound.json)."""
    import jax

    from tvjax.audit.distinguish import distinguish_texts
    from tvjax.cli import text_tokenizer
    from tvjax.core.jsonable import to_jsonable
    from tvjax.engines.answers import stored_texts

    kinds = {cfg[side].kind for side in ("pi", "mu")}
    if kinds != {"openai"}:
        raise CampaignError(f"campaign.access=text needs two text-only endpoints (engine kind openai), got {sorted(kinds)}")
    folder = Path(cfg.campaign.pool).parent
    folder.mkdir(parents=True, exist_ok=True)
    messages, t = OmegaConf.to_container(cfg.campaign.messages), cfg.campaign.text
    texts = [stored_texts(folder / "texts", side, engine_config(cfg[side]), messages, int(cfg.campaign.num_per_side),
                          int(cfg.campaign.n), int(cfg[side].seed)) for side in ("pi", "mu")]
    result = distinguish_texts(jax.random.key(int(t.seed)), *texts, text_tokenizer(t.tokenizer), classifier=t.classifier,
                               delta=float(t.delta))
    print(f"TV >= {result.lower_bound:.4f} at {100 * (1 - t.delta):g}% (estimate {result.estimate:.4f}; "
          f"{result.pi_test} + {result.mu_test} held-out completions)", flush=True)
    record = {"pi": engine_config(cfg.pi), "mu": engine_config(cfg.mu), "text": OmegaConf.to_container(t), **result._asdict()}
    (folder / "bound.json").write_text(json.dumps(to_jsonable(record), indent=1, allow_nan=False))
    return folder


@hydra.main(version_base="1.3", config_path="../configs", config_name="engine_campaign")
def main(cfg: DictConfig) -> None:
    if cfg.campaign.access == "text":
        print(f"texts and bound: {run_text_campaign(cfg)}")
        return
    if cfg.campaign.access != "scores":
        raise CampaignError(f"campaign.access must be scores or text, got {cfg.campaign.access!r}")
    pool = run_campaign(cfg)
    print(f"pool: {pool}")
    if cfg.campaign.report:
        run_report(pool, cfg.campaign.report_dir)
        print(f"report: {cfg.campaign.report_dir}")


if __name__ == "__main__":
    main()
