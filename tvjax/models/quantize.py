"""Weight-only quantization, GGUF's block formats, and the int8 KV cache: plain functions on arrays.

A weight is W [..., out, in] (Hugging Face's Linear layout, layers stacked in front). Quantized
weights are stored as integers plus scales and dequantized on the fly, in the compute dtype, inside
the forward pass (`tvjax.models.transformer.Linear.kernel`).

  int8   per output channel, symmetric absmax: scale [..., out] = max_i |W[o, i]| / 127,
         q = round(W / scale) int8 in [-127, 127]; W ~ q scale.
  int4   group-wise along the input axis (group_size g, default 32), symmetric absmax:
         scale [..., out, in/g] = max |W[o, group]| / 7, q = round(W / scale) in [-7, 7] (level -8
         unused); two values per byte (q + 8 in a nibble), in GGUF's order within a group: the
         first g/2 values in the low nibbles, the last g/2 in the high ones: uint8 [..., out, in/g, g/2].
  GGUF   blocks of 32 along the input axis, as the file stores them: Q4_0 (q - 8) d, Q4_1 q d + m
         (q a nibble), Q8_0 q d (q int8); d, m float16 per block.

Round trip of int8 / int4: |W - dequantize(quantize(W))| <= scale / 2 per element (rounding to the
nearest level; all-zero rows or groups have scale 0 and come back exactly).
The KV cache's int8 format is `quantize_int8` over head_dim: one scale per token and kv head
(causal: a token's cached value does not depend on later tokens).
"""

import jax.numpy as jnp
import numpy as np

INT8_LEVELS = 127
INT4_LEVELS = 7
DEFAULT_GROUP_SIZE = 32
GGUF_BLOCK = 32
# GGUF block formats computed as stored: bytes per block of 32 and the layout of a block.
GGUF_FORMATS = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def _absmax_scale(w, levels, axis=-1):
    return jnp.max(jnp.abs(w.astype(jnp.float32)), axis=axis) / levels


def _round(w, scale, levels):
    safe = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(w.astype(jnp.float32) / safe), -levels, levels)


def quantize_int8(w):
    """(q int8 [..., out, in], scale float32 [..., out]): symmetric absmax per output channel
    (per row of the last axis)."""
    scale = _absmax_scale(w, INT8_LEVELS)
    return _round(w, scale[..., None], INT8_LEVELS).astype(jnp.int8), scale


def dequantize_int8(q, scale, dtype="float32"):
    """q scale in `dtype` (the integers and the scale cast to it first)."""
    return q.astype(dtype) * jnp.asarray(scale).astype(dtype)[..., None]


def pack_nibbles(values):
    """uint8 [..., g/2] of integers [..., g] in [0, 15]: the first half low, the second half high."""
    values = jnp.asarray(values).astype(jnp.uint8)
    half = values.shape[-1] // 2
    return values[..., :half] | (values[..., half:] << 4)


def unpack_nibbles(packed):
    """Integers uint8 [..., 2 h] of packed [..., h] (the inverse of `pack_nibbles`)."""
    return jnp.concatenate([packed & 15, packed >> 4], axis=-1)


def check_group_size(group_size, d_in=None):
    """The group size, or a ValueError: a positive even integer dividing d_in (when given)."""
    if not (isinstance(group_size, int) and not isinstance(group_size, bool) and group_size >= 2
            and group_size % 2 == 0):
        raise ValueError(f"group_size must be a positive even integer, got {group_size!r}")
    if d_in is not None and d_in % group_size:
        raise ValueError(f"int4 group_size {group_size} does not divide the input dimension {d_in}")
    return group_size


def quantize_int4(w, group_size=DEFAULT_GROUP_SIZE):
    """(packed uint8 [..., out, in/g, g/2], scale float32 [..., out, in/g]): symmetric absmax per
    group of `group_size` inputs, values in [-7, 7] stored as nibbles q + 8."""
    check_group_size(group_size, w.shape[-1])
    groups = jnp.asarray(w).reshape(*w.shape[:-1], w.shape[-1] // group_size, group_size)
    scale = _absmax_scale(groups, INT4_LEVELS)
    q = _round(groups, scale[..., None], INT4_LEVELS).astype(jnp.int32)
    return pack_nibbles(q + 8), scale


def dequantize_int4(packed, scale, dtype="float32"):
    """W [..., out, in] in `dtype` of `quantize_int4`'s (packed, scale)."""
    q = unpack_nibbles(packed).astype(dtype) - jnp.asarray(8, dtype)
    w = q * jnp.asarray(scale).astype(dtype)[..., None]
    return w.reshape(*w.shape[:-2], -1)


# --------------------------------------------------------------------------- GGUF blocks


def gguf_blocks(raw, kind):
    """(q, d, m) numpy arrays of a GGUF tensor's raw bytes uint8 [rows, blocks * bytes]: Q4_0 / Q4_1
    q uint8 [rows, blocks, 16] (nibbles as stored), Q8_0 q int8 [rows, blocks, 32]; d and m float16
    [rows, blocks] (m None but for Q4_1)."""
    size = GGUF_FORMATS[kind]
    raw = np.ascontiguousarray(raw, np.uint8)
    blocks = raw.reshape(raw.shape[0], raw.shape[1] // size, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if kind == "Q4_1":
        return blocks[..., 4:].copy(), d, blocks[..., 2:4].copy().view(np.float16)[..., 0]
    if kind == "Q4_0":
        return blocks[..., 2:].copy(), d, None
    return blocks[..., 2:].copy().view(np.int8), d, None


def dequantize_gguf(kind, q, d, m=None, dtype="float32"):
    """W [..., out, in] in `dtype` of GGUF blocks (q, d, m) of `gguf_blocks` (layers may be stacked
    in front): every block dequantized in `dtype` (d, m cast to it)."""
    d = jnp.asarray(d).astype(dtype)[..., None]
    if kind == "Q8_0":
        w = q.astype(dtype) * d
    elif kind == "Q4_0":
        w = (unpack_nibbles(q).astype(dtype) - jnp.asarray(8, dtype)) * d
    elif kind == "Q4_1":
        w = unpack_nibbles(q).astype(dtype) * d + jnp.asarray(m).astype(dtype)[..., None]
    else:
        raise ValueError(f"GGUF block format {kind!r} is not one of {sorted(GGUF_FORMATS)}")
    return w.reshape(*w.shape[:-2], -1)
