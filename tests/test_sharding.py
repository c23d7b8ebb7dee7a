"""The trajectory axis shards across devices: two forced host devices give the numbers of a
one-device mesh for the same key (up to the order of float sums)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent(
    """
    import json, jax, numpy as np, tvjax
    from tvjax import Level, Samples, Schedule
    from tvjax.core.sharding import trajectory_mesh

    pi, mu = tvjax.paper_block_pair()
    tab_pi, tab_mu = tvjax.random_tabular_pair(seed=1, vocab_size=3, n=5, top_k=(2, None))
    key = jax.random.key(7)
    schedule = Schedule((96, 32), (1, 8))
    runs = {
        "likelihood_ratio": lambda: tvjax.likelihood_ratio(key, pi, mu, tvjax.Exact(), Samples(300)),
        "multilevel_noisy": lambda: tvjax.multilevel(key, pi, mu, tvjax.Noisy(0.5), schedule, num_groups=3),
        "sample_only": lambda: tvjax.multilevel(key, tab_pi, tab_mu, tvjax.Sampler(), schedule),
        "plugin_logit_noise": lambda: tvjax.plugin(key, tab_pi, tab_mu, tvjax.LogitNoise(0.3), Level(64, 4)),
        "plugin_kl": lambda: tvjax.plugin_kl(key, tab_pi, tab_mu, tvjax.Exact(), Samples(200)),
        "likelihood_ratio_copies": lambda: tvjax.likelihood_ratio(key, pi, mu, tvjax.Exact(), Samples(40), copies=16),
        "multilevel_copies": lambda: tvjax.multilevel(key, pi, mu, tvjax.Noisy(0.5), schedule, copies=3),
    }
    from tvjax.models import ModelConfig, language_model, random_model
    lm = language_model(random_model(ModelConfig("llama", 8, 16, 24, 2, 4, 2, 4, 32), jax.random.key(3)), [1, 2, 3], 4,
                        max_chunk_rows=32)
    lm_top_k = lm.variant(top_k=3)
    runs["language_model_exact"] = lambda: tvjax.likelihood_ratio(key, lm, lm_top_k, tvjax.Exact(), Samples(100))
    runs["language_model_noisy"] = lambda: tvjax.multilevel(key, lm, lm_top_k, tvjax.Noisy(0.3), schedule)
    mesh = trajectory_mesh()
    one_device = trajectory_mesh(jax.devices()[:1])
    out = {"devices": len(mesh.devices.flat)}
    for name, run in runs.items():
        with jax.set_mesh(one_device):
            single = run()
        with jax.set_mesh(mesh):
            sharded = run()
        out[name] = [np.concatenate([np.ravel(x) for x in jax.tree.leaves(r)]).tolist() for r in (single, sharded)]
    program = jax.jit(lambda k, p, m: tvjax.likelihood_ratio(k, p, m, tvjax.Exact(), Samples(1024), copies=4).value)
    with jax.set_mesh(mesh):
        hlo = program.lower(key, pi, mu).compile().as_text()
    out["collectives"] = {op: hlo.count(op) for op in ("all-reduce", "all-gather")}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def two_device_results():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_forced_devices(two_device_results):
    assert two_device_results["devices"] == 2


def test_chunks_are_partitioned_not_gathered(two_device_results):
    # Each device reduces its own trajectories; only the per-chunk moments cross devices.
    assert two_device_results["collectives"]["all-reduce"] > 0
    assert two_device_results["collectives"]["all-gather"] == 0


@pytest.mark.parametrize("name", ["likelihood_ratio", "multilevel_noisy", "sample_only", "plugin_logit_noise", "plugin_kl",
                                  "likelihood_ratio_copies", "multilevel_copies", "language_model_exact",
                                  "language_model_noisy"])
def test_sharded_matches_single_device(two_device_results, name):
    single, sharded = two_device_results[name]
    np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-6)


def test_shard_rows_is_identity_without_mesh():
    import jax.numpy as jnp

    from tvjax.core.sharding import shard_rows

    x = jnp.arange(6.0).reshape(3, 2)
    assert shard_rows(x) is x
