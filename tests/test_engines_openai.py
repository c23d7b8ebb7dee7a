"""The OpenAI-compatible bridge against vLLM's OpenAI server, started by the test on 127.0.0.1 with
the tiny random Llama whose EOS is often likely (STOP_EOS_SCALE), so that eos=stop outputs stop
early (loopback only; bounded requests: 3 completions + 3*6 per-prefix requests under a budget of
40, a budget refusal, 3 completions + 3 echo requests for the sequence-level scorer, and under
eos=stop, 4 completions + one request per real position, at most 4*8).

Tolerance (measured, fp32): the per-prefix readouts (prefill path, raw log-probs renormalized over
top-k without EOS) agree with the sampling-time readouts of the completions (decode path) to < 1e-5
(asserted <= 1e-3).
"""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
from _engine_envs import EOS_ID, ROOT, STOP_EOS_SCALE, build_tiny_model, check_stopped_pool, engine_env, engine_python, run_job

from tvjax.engines.answers import AnswerStore
from tvjax.pools import store as pools

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models


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
def server_log(tmp_path_factory):
    """The server's log: its access lines count the requests it answered."""
    return tmp_path_factory.mktemp("server") / "server.log"


def chat_requests(log):
    return log.read_text().count("POST /v1/chat/completions")


@pytest.fixture(scope="module")
def server(tmp_path_factory, server_log):
    python = engine_python("vllm")
    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", eos_scale=STOP_EOS_SCALE)
    port = free_port()
    log = open(server_log, "w")
    env = dict(engine_env(), VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")  # the log counts requests as they come
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


def api_engine(server, tmp_path, max_requests: int, n=6, num=3, eos="suppress") -> tuple:
    """A small pool (3 trajectories of 6 tokens) and the engine config of the local server."""
    url, model = server
    pool_path = tmp_path / "pool"
    pools.create_pool(pool_path, n=n, num_per_side=num, repeats=1, scorers=("api", "other"), top_k=8,
                      sample_logprobs=True, eos_ids=(EOS_ID,) if eos == "stop" else ())
    engine = {"kind": "openai", "name": "api", "model": str(model), "base_url": url, "served_model": "tiny",
              "top_k": 8, "seed": 0, "max_requests": max_requests, "requests_per_second": 50, "max_retries": 2,
              "timeout_s": 60, "max_concurrency": 4, "eos": eos}
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


def test_openai_bridge_with_outputs_that_stop_at_eos(server, tmp_path):
    """eos=stop: the server stops completions at EOS (no logit_bias, no ignore_eos); per-prefix
    readouts are requested for real positions only and keep EOS, so the EOS step is scored."""
    pool_path, engine = api_engine(server, tmp_path, max_requests=4 + 4 * 8, n=8, num=4, eos="stop")
    run_job(engine_python("vllm"), pool_path, engine, [("sample", "pi"), ("score", "pi")])
    spec, _ = pools.read_spec(pool_path)
    group = __import__("zarr").open_group(str(pool_path), mode="r")
    lp, slp = np.asarray(group["logprobs/pi/api"][:, :, 0]), np.asarray(group["sample_logprobs/pi"][:])
    assert np.isfinite(lp).all() and np.abs(lp - slp).max() <= 1e-3
    side = SimpleNamespace(spec=spec, lengths={"pi": pools.read_lengths(pool_path, "pi")},
                           tokens={"pi": pools.read_tokens(pool_path, "pi")}, sample_logprobs={"pi": slp},
                           logprobs={"pi": {"api": lp[:, :, None]}},
                           topk_ids={"pi": {"api": np.asarray(group["topk_ids/pi/api"][:])}})  # mu is not sampled
    check_stopped_pool(side, "pi", ("api",))


def test_text_only_endpoints_give_a_certified_lower_bound_in_one_command(server, server_log, tmp_path):
    """`tvjax distinguish` against two text-only chat endpoints (the local server, sampling at
    temperature 1 for pi and greedily, top_k 1, for mu): chat completions without
    log-probabilities, UTF-8 bytes as tokens. Greedy decoding gives one text, so nearly every
    sampled completion differs from it: the certified bound is far above 0. A rerun reuses the
    stored completions: the same bound, and not one request reaches the server."""
    url, _ = server
    samples, record = tmp_path / "texts", tmp_path / "bound.json"
    args = ["--pi-model", "tiny", "--mu-model", "tiny", "--mu-extra", '{"top_k": 1}', "--num", "120",
            "--max-tokens", "6", "--samples", str(samples), "--json", str(record)]
    first = subprocess.run([sys.executable, "-m", "tvjax", "distinguish", "--pi-url", url, "--mu-url", url, *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and first.stdout.startswith("TV >= "), first.stdout + first.stderr[-2000:]
    result = json.loads(record.read_text())
    assert result["lower_bound"] > 0.5 and result["pi_test"] == result["mu_test"] == 60
    stored = {side: AnswerStore.open(samples / side).answers() for side in ("pi", "mu")}
    assert [len(a) for a in stored.values()] == [120, 120]
    assert len({a.text for a in stored["mu"].values()}) == 1  # greedy: one text
    answered = chat_requests(server_log)
    again = subprocess.run([sys.executable, "-m", "tvjax", "distinguish", "--pi-url", url, "--mu-url", url, *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and json.loads(record.read_text())["lower_bound"] == result["lower_bound"], again.stderr
    assert chat_requests(server_log) == answered


def test_text_only_campaign_through_the_campaign_runner(server, tmp_path):
    """engine_campaign.py campaign.access=text with two openai engines (the local server at
    temperature 1 against top_k 1 through extra_body): completions kept in the answer stores texts/pi, texts/mu and the
    certified bound in bound.json."""
    url, model = server
    common = [f"base_url={url}", "served_model=tiny", "requests_per_second=50", "max_concurrency=4"]
    cmd = [sys.executable, "experiments/engine_campaign.py", "engine@pi=openai", "engine@mu=openai", "pi.name=sampled",
           "mu.name=greedy", *(f"{side}.{kv}" for side in ("pi", "mu") for kv in common), "+mu.extra_body.top_k=1",
           f"campaign.model={model}", "campaign.access=text", "campaign.num_per_side=100", "campaign.n=6",
           f"campaign.pool={tmp_path / 'pool'}", f"hydra.run.dir={tmp_path}"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "TV >= " in run.stdout, run.stdout + run.stderr[-3000:]
    bound = json.loads((tmp_path / "bound.json").read_text())
    assert bound["lower_bound"] > 0.5 and bound["pi_test"] == 50
    assert [len(AnswerStore.open(tmp_path / "texts" / side).answers()) for side in ("pi", "mu")] == [100, 100]


def test_reference_audit_of_the_server_serving_the_reference_passes(server, tmp_path):
    """`tvjax gate --reference MODEL --endpoint URL` with the local server serving the reference
    itself (vLLM fp32 against the JAX engine on the same weights, outputs that stop at EOS): the
    exact null, so the anytime-valid gate must not FAIL (probability <= delta), and it spends the budget."""
    url, model = server
    cmd = [sys.executable, "-m", "tvjax", "gate", "--reference", str(model), "--endpoint", url, "--served-model", "tiny",
           "--max-tokens", "6", "--m", "8", "--budget", "120", "--round-size", "40", "--answers", str(tmp_path / "answers"),
           "--requests-per-second", "100", "--json", str(tmp_path / "gate.json")]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.startswith("PASS  no difference above tau=0"), run.stdout + run.stderr[-3000:]
    record = json.loads((tmp_path / "gate.json").read_text())
    assert record["bound"]["calls"] == 120 and record["bound"]["lower_bound"] == 0.0
    assert len(AnswerStore.open(tmp_path / "answers").answers()) == 120


def test_grey_box_audit_against_the_servers_own_noise_floor(server, tmp_path):
    """Grey-box mode: the server's reported log-probs of its sampled tokens against the JAX
    reference's exact ones, beside the same deviation of a second run (the floor, here the same
    server): one model, so neither the rank gate nor the grey-box test says FAIL."""
    url, model = server
    cmd = [sys.executable, "-m", "tvjax", "gate", "--reference", str(model), "--endpoint", url, "--served-model", "tiny",
           "--floor-endpoint", url, "--floor-model", "tiny", "--extra", '{"return_tokens_as_token_ids": true}',
           "--max-tokens", "6", "--m", "4", "--budget", "40", "--round-size", "40", "--answers", str(tmp_path / "answers"),
           "--requests-per-second", "100", "--json", str(tmp_path / "gate.json")]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "PASS  grey-box" in run.stdout, run.stdout + run.stderr[-3000:]
    grey = json.loads((tmp_path / "gate.json").read_text())["greybox"]
    assert grey["calls"] == grey["floor_calls"] == 40 and grey["target_median"] < 1e-3  # fp32 against fp32
