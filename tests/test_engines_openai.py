"""The OpenAI-compatible bridge against vLLM's OpenAI server, started by the test on 127.0.0.1 with
the tiny random Llama (loopback only; bounded requests: 3 completions + 3*6 per-prefix requests under
a budget of 40, a budget refusal, and 3 completions + 3 echo requests for the sequence-level scorer).

Tolerance (measured, fp32): the per-prefix readouts (prefill path, raw log-probs renormalized over
top-k without EOS) agree with the sampling-time readouts of the completions (decode path) to < 1e-5
(asserted <= 1e-3).
"""

import json
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest
from _engine_envs import ROOT, build_tiny_model, engine_env, engine_python, run_job

from tvjax import pools


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the vLLM server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as resp:
                json.loads(resp.read())
                return
        except OSError:
            time.sleep(2)
    raise AssertionError(f"the vLLM server did not answer within {timeout} s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    python = engine_python("vllm")
    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    port = free_port()
    log = open(tmp_path_factory.mktemp("server") / "server.log", "w")
    env = dict(engine_env(), VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.Popen([python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                             "--dtype", "float32", "--enforce-eager", "--no-enable-prefix-caching", "--seed", "0"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(url, proc, timeout=300)
        yield url, model
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def api_engine(server, tmp_path, max_requests: int) -> tuple:
    """A small pool (3 trajectories of 6 tokens) and the engine config of the local server."""
    url, model = server
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=6, num_per_side=3, repeats=1, scorers=("api", "other"), top_k=8,
                      sample_logprobs=True)
    engine = {"kind": "openai", "name": "api", "model": str(model), "base_url": url, "served_model": "tiny",
              "top_k": 8, "seed": 0, "max_requests": max_requests, "requests_per_second": 50, "max_retries": 2,
              "timeout_s": 60, "max_concurrency": 4}
    return pool_path, engine


def test_openai_bridge_against_a_local_vllm_server(server, tmp_path):
    pool_path, engine = api_engine(server, tmp_path, max_requests=40)
    run_job(engine_python("vllm"), pool_path, engine, [("sample", "pi"), ("score", "pi")])
    group = __import__("zarr").open_group(str(pool_path), mode="r")
    tokens, lp = np.asarray(group["tokens/pi"][:]), np.asarray(group["logprobs/pi/api"][:, :, 0])
    slp = np.asarray(group["sample_logprobs/pi"][:])
    assert tokens.shape == (3, 6) and not np.isin(tokens, [2]).any()  # EOS (<|im_end|>, id 2) suppressed
    assert np.isfinite(lp).all() and np.abs(lp - slp).max() <= 1e-3


def test_openai_bridge_refuses_a_pass_beyond_its_budget(server, tmp_path):
    pool_path, engine = api_engine(server, tmp_path, max_requests=10)
    with pytest.raises(AssertionError, match="BudgetExceeded"):
        run_job(engine_python("vllm"), pool_path, engine, [("sample", "pi"), ("score", "pi")])
    assert pools.coverage(pool_path)["tokens/pi"].all()  # the sampled shard was kept


def test_openai_sequence_level_scorer_uses_echo(server, tmp_path):
    pool_path, engine = api_engine(server, tmp_path, max_requests=6)
    run_job(engine_python("vllm"), pool_path, engine, [("sample", "pi"), ("score", "pi")], scoring="sequence")
    group = __import__("zarr").open_group(str(pool_path), mode="r")
    lp, slp = np.asarray(group["logprobs/pi/api"][:, :, 0]), np.asarray(group["sample_logprobs/pi"][:])
    assert np.isfinite(lp).all() and np.abs(lp - slp).max() <= 1e-3
