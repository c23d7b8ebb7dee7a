"""Finding the engine venvs for tests, and running code in them.

A test that needs an engine venv FAILS in CI (CI=true) when the venv is missing -- CI must have run
.ci/engines_setup.sh -- and is skipped with the reason elsewhere.
Venvs: $TVJAX_TRANSFORMERS_PYTHON / $TVJAX_VLLM_PYTHON, else <repo>/.venv-transformers, .venv-vllm.
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV_VARS = {"transformers": "TVJAX_TRANSFORMERS_PYTHON", "vllm": "TVJAX_VLLM_PYTHON", "met": "TVJAX_MET_PYTHON"}


def require(present: bool, reason: str) -> None:
    """Fail in CI (which must have run .ci/engines_setup.sh), skip with `reason` elsewhere."""
    if present:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def engine_python(engine: str) -> str:
    """The Python of an engine venv; fail in CI, skip elsewhere, when it is missing."""
    path = Path(os.environ.get(ENV_VARS[engine]) or ROOT / f".venv-{engine}" / "bin" / "python")
    require(path.is_file(), f"engine venv {engine!r} missing at {path}: run `bash .ci/engines_setup.sh {engine}`")
    return str(path)


def engine_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def run_in(python: str, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python args...` from the repo root with tvjax importable; raise with its output on failure."""
    proc = subprocess.run([python, *args], cwd=ROOT, env=engine_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Tell me a story about a robot learning to paint."}]


# EOS row scale of the tiny model for eos=stop tests: with top-k 8 about half of the rows stop within
# 12 tokens, at lengths spread over 1..12 (measured on 64 rows: 27 reach 12, the rest 1-11)
STOP_EOS_SCALE = 2.5
EOS_ID = 2  # the tiny model's <|im_end|>


def build_tiny_model(folder: Path, eos_scale: float = 1.0) -> Path:
    """The tiny random Llama of tvjax.engines.tiny_model, built by the transformers venv."""
    if not (folder / "config.json").is_file():
        run_in(engine_python("transformers"), ["-m", "tvjax.engines.tiny_model", str(folder),
                                               "--eos-scale", str(eos_scale)], timeout=300)
    return folder


def run_job(python: str, pool: Path, engine: dict, tasks: list[tuple[str, str]], scoring: str = "replay",
            timeout: float = 900) -> list[dict]:
    """Run one worker job; return its JSON progress events."""
    import json

    job = {"engine": engine, "pool": str(pool), "messages": MESSAGES, "scoring": scoring,
           "tasks": [{"op": op, "side": side} for op, side in tasks]}
    path = pool.parent / f"job-{engine['name']}-{len(list(pool.parent.glob('job-*')))}.json"
    path.write_text(json.dumps(job))
    proc = run_in(python, ["-m", "tvjax.engines.worker", str(path)], timeout=timeout)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def check_own_side(pool, side: str, scorer: str, tol: float) -> float:
    """Replay forcing is exact on a side's own sampler: no zero mass, and every pass agrees with the
    log-probabilities the engine reported at sampling time within `tol`. Returns the max deviation."""
    import numpy as np

    lp = pool.logprobs[side][scorer]
    assert np.isfinite(lp).all(), f"{scorer} assigns zero mass to {int((~np.isfinite(lp)).sum())} of its own tokens"
    deviation = float(np.abs(lp - pool.sample_logprobs[side][:, :, None]).max())
    assert deviation <= tol, f"{scorer} replay vs sampling-time log-probs differ by {deviation} > {tol}"
    return deviation


def check_stopped_pool(pool, side: str, scorers) -> None:
    """A side of a pool whose outputs stop at EOS: lengths vary and match the tokens, the EOS step's
    draw is finite under every scorer (its probability is recorded), every padded position is 0."""
    import numpy as np

    from tvjax.pools import store as pools

    lengths, tokens, n = pool.lengths[side], pool.tokens[side], pool.spec.n
    assert np.array_equal(lengths, pools.stopped_lengths(tokens, pool.spec.eos_ids))
    assert len(set(lengths.tolist())) >= 2 and (lengths < n).any(), f"lengths {lengths} do not vary"
    stopped = np.flatnonzero(lengths < n)
    assert (tokens[stopped, lengths[stopped] - 1] == EOS_ID).all()
    padded = pools.padded_positions(lengths, n)
    assert (pool.sample_logprobs[side][padded] == 0).all()
    for scorer in scorers:
        lp = pool.logprobs[side][scorer]
        assert np.isfinite(lp[stopped, lengths[stopped] - 1]).all()
        assert (lp[padded] == 0).all() and (pool.topk_ids[side][scorer][padded] == EOS_ID).all()
