"""Input checks shared by every layer: a clear exception at the boundary, never a NaN later.

Checks only run on concrete values; inside jit/vmap a traced value passes through unchecked
(the caller outside the trace was already checked).
"""

import jax
import numpy as np


def is_concrete(value):
    return not isinstance(value, jax.core.Tracer)


def all_concrete(tree):
    """No leaf of `tree` is traced (so its values can be checked and can choose static shapes)."""
    return all(is_concrete(leaf) for leaf in jax.tree.leaves(tree))


def check_range(name, value, low=None, high=None, low_open=False, high_open=False):
    """Raise ValueError unless low <(=) value <(=) high (for every element of an array)."""
    if not is_concrete(value):
        return
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name} must be a number, got {value!r}")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r:.80}") from None
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if low is not None and (np.any(arr <= low) if low_open else np.any(arr < low)):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    if high is not None and (np.any(arr >= high) if high_open else np.any(arr > high)):
        bound = f"< {high}" if high_open else f"<= {high}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def check_positive_int(name, value, minimum=1):
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r:.80}")
    if not np.isfinite(value) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_probability_vector(name, probs, axis=-1, atol=1e-6):
    """Entries in [0, 1] and summing to 1 along `axis`."""
    arr = np.asarray(probs, dtype=np.float64)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        bad = arr[~((arr >= 0) & (arr <= 1))]
        raise ValueError(f"{name} has probabilities outside [0, 1], e.g. {bad.ravel()[:3]}")
    sums = arr.sum(axis=axis)
    if not np.allclose(sums, 1.0, atol=atol):
        worst = sums.ravel()[np.argmax(np.abs(sums.ravel() - 1.0))]
        raise ValueError(f"{name} does not sum to 1 along axis {axis} (found a sum of {worst:.6g})")
    return arr


# A row of log-probabilities normalises when |logsumexp(row)| <= this: float32 storage of an exact
# row errs by about 1e-7, so this admits rounding and refuses any real mass defect.
LOG_MASS_ATOL = 1e-4


def _first_bad_row(mask):
    """Index (a tuple over the leading axes) of the first True in `mask`, for error messages."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def check_logits(name, logits, axis=-1):
    """Logits may be -inf (zero mass) but not NaN or +inf, and each row along `axis` needs a finite
    entry (a row of all -inf is no distribution). Names the first bad row."""
    arr = np.moveaxis(np.asarray(logits, dtype=np.float64), axis, -1)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    for bad, what in ((np.isnan(arr), "NaN"), (arr == np.inf, "+inf")):
        if bad.any():
            raise ValueError(f"{name} has a {what} entry in row {_first_bad_row(bad.any(axis=-1))}")
    empty = ~np.isfinite(arr).any(axis=-1)
    if empty.any():
        raise ValueError(f"{name} row {_first_bad_row(empty)} is all -inf: no token has positive probability")
    return arr


def check_log_distribution(name, logprobs, axis=-1, atol=LOG_MASS_ATOL):
    """Log-probabilities (-inf = zero mass) whose rows along `axis` each sum to 1: no NaN or +inf,
    and |logsumexp(row)| <= atol. Names the first bad row."""
    arr = check_logits(name, logprobs, axis)
    peak = np.max(arr, axis=-1, keepdims=True)
    log_mass = (peak + np.log(np.sum(np.exp(arr - peak), axis=-1, keepdims=True)))[..., 0]
    off = np.abs(log_mass) > atol
    if off.any():
        row = _first_bad_row(off)
        with np.errstate(over="ignore"):
            total = np.exp(log_mass[row])
        raise ValueError(f"{name} row {row} does not normalise: its probabilities sum to {total:.6g} "
                         f"(log-mass {log_mass[row]:.3g}, tolerance {atol:g})")
    return arr


def check_key(key, name="key"):
    """One JAX PRNG key: a typed key of shape () (jax.random.key) or a raw uint32 [2]
    (jax.random.PRNGKey); not a seed, and not a batch of keys."""
    if not is_concrete(key):
        return key
    if isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"{name} must be one PRNG key, got a batch of shape {key.shape} (split outside, vmap over copies)")
        return key
    arr = np.asarray(key) if isinstance(key, (np.ndarray, jax.Array)) else None
    if arr is None or arr.dtype != np.uint32 or arr.shape != (2,):
        raise TypeError(f"{name} must be a JAX PRNG key such as jax.random.key(0), got {key!r:.80}")
    return key


def check_process(name, process):
    """Something that answers the process protocol (sample, path_logprobs, n, vocab_size)."""
    missing = [attr for attr in ("sample", "path_logprobs", "n", "vocab_size") if not hasattr(process, attr)]
    if missing:
        raise TypeError(f"{name} must be a process (with sample, path_logprobs, n and vocab_size), got "
                        f"{type(process).__name__} without {', '.join(missing)}")


def check_pair(pi, mu):
    """pi and mu must describe sequences of the same length over the same vocabulary (and the
    same tokenizer, where processes carry a `vocab_id`)."""
    check_process("pi", pi)
    check_process("mu", mu)
    if pi.n != mu.n:
        raise ValueError(f"pi and mu have different sequence lengths: n={pi.n} vs n={mu.n}")
    if pi.vocab_size != mu.vocab_size:
        raise ValueError(
            f"pi and mu have different vocabularies: {pi.vocab_size} vs {mu.vocab_size} tokens"
        )
    # Processes with a tokenizer (language models) name it by a hash of its vocabulary: the same
    # size is not enough when the ids name other strings.
    if getattr(pi, "vocab_id", None) != getattr(mu, "vocab_id", None):
        raise ValueError("pi and mu have different tokenizers (vocabulary hashes differ): their token ids "
                         "do not name the same strings")


def check_repeats(repeats):
    """A repeat schedule: positive integers, strictly increasing."""
    repeats = tuple(check_positive_int("repeat count r", r) for r in repeats)
    if not repeats:
        raise ValueError("the repeat schedule is empty")
    if any(b <= a for a, b in zip(repeats, repeats[1:])):
        raise ValueError(f"repeat counts must be strictly increasing, got {repeats}")
    return repeats
