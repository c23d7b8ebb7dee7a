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
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if low is not None and (np.any(arr <= low) if low_open else np.any(arr < low)):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    if high is not None and (np.any(arr >= high) if high_open else np.any(arr > high)):
        bound = f"< {high}" if high_open else f"<= {high}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def check_positive_int(name, value, minimum=1):
    if isinstance(value, bool) or int(value) != value or value < minimum:
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


def check_pair(pi, mu):
    """pi and mu must describe sequences of the same length over the same vocabulary (and the
    same tokenizer, where processes carry a `vocab_id`)."""
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
