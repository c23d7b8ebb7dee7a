"""The shape of a decoder-only transformer, read from a Hugging Face config.json or GGUF metadata.

One `ModelConfig` covers Llama (SmolLM2), Qwen2 and Qwen3: they differ only in the flags below
(attention biases, q/k RMSNorm, tied embeddings).
"""

from typing import NamedTuple


class ModelConfig(NamedTuple):
    architecture: str  # "llama", "qwen2" or "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    qkv_bias: bool = False  # biases on the q, k and v projections (always on in Qwen2)
    o_bias: bool = False  # a bias on the output projection (Llama's and Qwen3's attention_bias)
    qk_norm: bool = False  # RMSNorm over the head dimension of q and k before RoPE (Qwen3)


ARCHITECTURES = ("llama", "qwen2", "qwen3")


def check_config(config):
    """The config, or a ValueError naming what is wrong with it."""
    if config.architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {config.architecture!r}; supported: {', '.join(ARCHITECTURES)}")
    sizes = {name: getattr(config, name) for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                                       "num_heads", "num_kv_heads", "head_dim", "max_positions")}
    bad = [f"{name}={value}" for name, value in sizes.items() if not isinstance(value, int) or value < 1]
    if bad:
        raise ValueError(f"model config needs positive integer sizes, got {', '.join(bad)}")
    if config.num_heads % config.num_kv_heads:
        raise ValueError(f"num_heads={config.num_heads} is not a multiple of num_kv_heads={config.num_kv_heads}")
    if config.head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {config.head_dim}")
    return config


def _architecture(model_type):
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {model_type!r}; supported: {', '.join(ARCHITECTURES)}")
    return model_type


def _rope_theta(rope):
    """theta of a default RoPE; scaled variants (llama3, yarn, ...) are not implemented."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"RoPE type {kind!r} is not supported (only 'default')")
    return float(rope.get("rope_theta", 10000.0))


def config_from_hf(hf):
    """ModelConfig from a parsed Hugging Face config.json (transformers 4.x or 5.x spelling)."""
    arch = _architecture(hf.get("model_type"))
    if hf.get("mlp_bias"):
        raise ValueError("mlp_bias=True is not supported")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    attention_bias = bool(hf.get("attention_bias", False))
    return check_config(ModelConfig(
        architecture=arch,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        max_positions=hf["max_position_embeddings"],
        rope_theta=_rope_theta(rope),
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or attention_bias,
        o_bias=arch != "qwen2" and attention_bias,
        qk_norm=arch == "qwen3",
    ))


def config_to_hf(config):
    """The config.json transformers reads back as the same model."""
    names = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    hf = {
        "architectures": [names[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_positions,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "hidden_act": "silu",
    }
    if config.architecture != "qwen2":
        if config.qkv_bias != config.o_bias:
            raise ValueError(f"{config.architecture} has one attention_bias flag: qkv_bias and o_bias must agree")
        hf["attention_bias"] = config.qkv_bias
    return hf


def config_from_gguf(metadata, tensor_names, vocab_size):
    """ModelConfig from GGUF metadata (a dict of field name -> value) and the file's tensor names
    (biases and an untied `output.weight` are known by their presence); `vocab_size` is the number
    of tokens, used when the file states no `{arch}.vocab_size`."""
    arch = _architecture(metadata.get("general.architecture"))
    get = lambda key, default=None: metadata.get(f"{arch}.{key}", default)
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    return check_config(ModelConfig(
        architecture=arch,
        vocab_size=int(get("vocab_size", vocab_size)),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", get("rope.dimension_count", hidden // heads))),
        max_positions=int(get("context_length")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_embeddings="output.weight" not in tensor_names,
        qkv_bias=arch == "qwen2" or "blk.0.attn_q.bias" in tensor_names,
        o_bias="blk.0.attn_output.bias" in tensor_names,
        qk_norm=arch == "qwen3",
    ))
