"""The engine_campaign Hydra app: every engine experiment composes, and a campaign killed mid-way
resumes without redoing committed shards and ends with the same pool as an uninterrupted one."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _engine_envs import EOS_ID, ROOT, STOP_EOS_SCALE, build_tiny_model, check_stopped_pool, engine_python
from hydra import compose, initialize_config_dir

from tvjax.pools import store as pools

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models

EXPERIMENTS = ["engine_campaign", "engine_fp32_vs_bf16", "engine_topk20_vs_topk30"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_engine_experiments_compose(experiment):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="engine_campaign", overrides=[f"experiment={experiment}"])
    assert cfg.pi.name != cfg.mu.name and (cfg.pi.seed, cfg.mu.seed) == (0, 1)
    assert cfg.pi.kind in ("transformers", "vllm") and cfg.campaign.scoring == "replay"
    assert cfg.campaign.eos == cfg.pi.eos == cfg.mu.eos == "suppress"  # the paper's protocol by default


def campaign_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("engine_campaign", ROOT / "experiments" / "engine_campaign.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_campaign_eos_sets_both_engines_and_a_side_alone_is_refused():
    app = campaign_module()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        stop = compose(config_name="engine_campaign", overrides=["campaign.eos=stop"])
        alone = compose(config_name="engine_campaign", overrides=["pi.eos=stop"])
        wrong = compose(config_name="engine_campaign", overrides=["campaign.eos=truncate"])
    assert (stop.pi.eos, stop.mu.eos, app.eos_mode(stop)) == ("stop", "stop", "stop")
    with pytest.raises(app.CampaignError, match="both engines must treat EOS alike"):
        app.eos_mode(alone)
    with pytest.raises(app.CampaignError, match="campaign.eos must be one of"):
        app.eos_mode(wrong)


GPU_RECIPE = ["engine@pi=vllm", "engine@mu=sglang", "pi.name=vllm", "mu.name=sglang", "campaign.model=/models/Qwen3-0.6B",
              "campaign.num_per_side=512", "campaign.n=500", "campaign.repeats=16", "pi.dtype=bfloat16",
              "mu.dtype=bfloat16", "pi.max_num_seqs=512", "pi.python=.venv-vllm-gpu/bin/python"]


def test_the_gpu_recipe_of_docs_engines_composes():
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="engine_campaign", overrides=GPU_RECIPE)
    assert (cfg.pi.kind, cfg.mu.kind, cfg.pi.top_k, cfg.mu.top_k) == ("vllm", "sglang", 20, 20)
    assert cfg.mu.model == "/models/Qwen3-0.6B" and cfg.mu.python == ".venv-sglang/bin/python"


def test_every_engine_config_composes():
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        for kind in ("transformers", "vllm", "sglang", "openai"):
            cfg = compose(config_name="engine_campaign", overrides=[f"engine@mu={kind}", "mu.name=other"])
            assert cfg.mu.kind == kind and cfg.mu.python.endswith("python")


def campaign_cmd(model, pool, run_dir, report: bool, n=8, repeats=4) -> list[str]:
    t = engine_python("transformers")
    return [sys.executable, "experiments/engine_campaign.py", "experiment=engine_fp32_vs_bf16",
            f"campaign.model={model}", "campaign.num_per_side=8", f"campaign.n={n}", f"campaign.repeats={repeats}",
            "pi.top_k=8", "mu.top_k=8", "mu.dtype=float32", "mu.attn_implementation=eager", "mu.name=hf_eager",
            f"pi.python={t}", f"mu.python={t}", f"campaign.convert_python={t}", f"campaign.pool={pool}",
            f"campaign.report={str(report).lower()}", f"hydra.run.dir={run_dir}"]


def committed(pool) -> int:
    folder = pool / "commits"
    return len(list(folder.glob("*.json"))) if folder.is_dir() else 0


def test_killed_campaign_resumes_to_the_same_pool(tmp_path):
    model = build_tiny_model(tmp_path / "model")
    full, killed = tmp_path / "full" / "pool", tmp_path / "killed" / "pool"
    subprocess.run(campaign_cmd(model, full, tmp_path / "full", report=True), cwd=ROOT, check=True, timeout=900)
    assert (tmp_path / "full" / "report" / "summary.md").is_file()

    proc = subprocess.Popen(campaign_cmd(model, killed, tmp_path / "killed", report=False), cwd=ROOT,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while committed(killed) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {f.name: f.read_text() for f in (killed / "commits").glob("*.json")}
    assert 3 <= len(before) < 2 + 4 * 4, f"the kill came at {len(before)} committed shards"

    subprocess.run(campaign_cmd(model, killed, tmp_path / "killed", report=False), cwd=ROOT, check=True,
                   timeout=900)
    a, b = pools.load_pool(full), pools.load_pool(killed)
    for side in pools.SIDES:
        assert np.array_equal(a.tokens[side], b.tokens[side])
        assert np.array_equal(a.sample_logprobs[side], b.sample_logprobs[side])
        for scorer in a.spec.scorers:
            assert np.array_equal(a.logprobs[side][scorer], b.logprobs[side][scorer])
            assert np.array_equal(a.topk_ids[side][scorer], b.topk_ids[side][scorer])
    after = {f.name: f.read_text() for f in (killed / "commits").glob("*.json")}
    assert len(after) == 2 + 4 * 4
    assert all(after[name] == marker for name, marker in before.items())  # committed shards were not redone


def test_a_campaign_of_outputs_that_stop_at_eos(tmp_path):
    """campaign.eos=stop: the pool is created with the EOS ids the worker's --describe-eos finds,
    both engines stop at EOS, the metadata says so; a rerun resumes (nothing redone) and a rerun
    with campaign.eos=suppress on that pool is refused."""
    model = build_tiny_model(tmp_path / "model", eos_scale=STOP_EOS_SCALE)
    pool = tmp_path / "run" / "pool"
    cmd = campaign_cmd(model, pool, tmp_path / "run", report=False, n=12, repeats=1) + ["campaign.eos=stop"]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=900)
    loaded = pools.load_pool(pool)
    assert loaded.spec.eos_ids == (EOS_ID,) and loaded.metadata["eos_ids"] == [EOS_ID]
    assert loaded.metadata["eos"] == "stop" and loaded.metadata["eos_suppressed"] is False
    for side in pools.SIDES:
        check_stopped_pool(loaded, side, loaded.spec.scorers)
    before = {f.name: f.read_text() for f in (pool / "commits").glob("*.json")}
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=900, capture_output=True)
    assert {f.name: f.read_text() for f in (pool / "commits").glob("*.json")} == before
    refused = subprocess.run(cmd[:-1], cwd=ROOT, timeout=900, capture_output=True, text=True)
    assert refused.returncode != 0 and "differs from requested" in refused.stderr
