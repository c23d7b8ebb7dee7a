"""What an estimator is told to spend: its sizes, as small NamedTuples, and their checks.

* `Samples(num, repeats=1)`         one-sided estimators: num trajectories of pi, scored at r draws
* `Level(num_per_side, repeats=1)`  the single-level plug-in: num trajectories from each side
* `Schedule(num_samples, repeats)`  Algorithm 3: level l has num_samples[l] trajectories per side
                                    at repeats[l] draws

Sizes are runtime values: their entries may be traced, so one compiled program serves every size
(and every schedule of one length). A leading axis of `copies` gives per-copy sizes. Checks run on
concrete values only; a traced size passes through (its caller outside the trace was checked).
"""

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from tvjax.core import cost
from tvjax.core.validate import all_concrete, check_positive_int, check_range, check_repeats

# Sizes are counted in int32 inside the estimators' programs.
MAX_COUNT = 2**31 - 1


class Samples(NamedTuple):
    """One-sided sizes: `num` trajectories from pi, scored at `repeats` draws per position."""

    num: object
    repeats: object = 1

    def queries(self, n):
        return cost.trajectory_queries(np.asarray(self.num, np.float64), n, np.asarray(self.repeats, np.float64))


class Level(NamedTuple):
    """Single-level symmetric sizes: `num_per_side` trajectories from each side at `repeats` draws."""

    num_per_side: object
    repeats: object = 1

    def queries(self, n):
        return cost.symmetric_queries(np.asarray(self.num_per_side, np.float64), n, np.asarray(self.repeats, np.float64))


class Schedule(NamedTuple):
    """Multilevel schedule: level l uses num_samples[l] trajectories per side at repeats[l] draws."""

    num_samples: tuple
    repeats: tuple

    def queries(self, n):
        num, repeats = (np.asarray(part, np.float64) for part in self)
        return np.sum(cost.symmetric_queries(num, n, repeats), axis=-1)


def as_int32(values):
    """Sizes as int32: numpy while concrete (inside an outer jit a jnp array of a constant is a
    tracer, and the static chunk size is chosen from concrete sizes), jnp when traced."""
    if not all_concrete(values):
        return jnp.asarray(values, jnp.int32)
    array = np.asarray(values)
    if array.size and array.dtype != bool and np.issubdtype(array.dtype, np.number) and np.any(np.abs(array) > MAX_COUNT):
        raise ValueError(f"sizes must be at most {MAX_COUNT} (int32), got {values!r}")
    return array.astype(np.int32)


def check_counts(name, counts, minimum):
    """Integer counts >= minimum, elementwise, as int32; traced counts pass through."""
    if all_concrete(counts):
        array = np.asarray(counts)
        numeric = array.dtype != bool and np.issubdtype(array.dtype, np.number)
        integral = numeric and np.all(np.isfinite(array.astype(float))) and np.all(array == np.round(array))
        if array.size == 0 or not integral or np.any(array < minimum):
            raise ValueError(f"{name} must be integers >= {minimum}, got {counts!r}")
        if np.any(array > MAX_COUNT):
            raise ValueError(f"{name} must be at most {MAX_COUNT} (sizes are counted in int32), got {counts!r}")
    return as_int32(counts)


def check_repeat_count(repeats):
    """A single repeat count r >= 1 (of Samples or Level), as int32; traced passes through."""
    if all_concrete(repeats):
        check_repeats((np.asarray(repeats).item(),))
    return as_int32(repeats)


def per_copy(sizes, copies, shape=()):
    """Sizes broadcast to [copies, *shape] (one copy when copies is None)."""
    sizes = as_int32(sizes)
    xp = np if isinstance(sizes, np.ndarray) else jnp
    has_copies_axis = sizes.ndim > len(shape)
    if copies is None:
        if has_copies_axis:
            raise ValueError(f"sizes of shape {sizes.shape} have a copies axis: pass copies={sizes.shape[0]}")
        return sizes[None]
    copies = check_positive_int("copies", copies)
    if has_copies_axis and sizes.shape[0] != copies:
        raise ValueError(f"per-copy sizes have {sizes.shape[0]} entries for {copies} copies")
    return xp.broadcast_to(sizes, (copies,) + shape)


def check_schedule(schedule):
    """A schedule's level sizes and repeats as int32 arrays, checked where concrete. Level sizes
    are [L], or [copies, L] for per-copy schedules.

    N_l = 1 is allowed (the paper's finest levels use it); such a level's within-side variance is
    0 by construction, so its stderr contribution is a lower bound. Trailing levels with N_l = 0
    are padding (see `pad_schedule`): they cost nothing and add nothing."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"multilevel sizes must be a Schedule(num_samples, repeats), got {schedule!r}")
    counts, repeats = (as_int32(part) for part in schedule)
    if repeats.ndim != 1 or counts.ndim not in (1, 2) or counts.shape[-1] != repeats.shape[0]:
        raise ValueError(f"schedule has level sizes of shape {counts.shape} for {repeats.shape} repeat counts")
    if not repeats.shape[0]:
        raise ValueError("the schedule has no levels")
    if all_concrete(schedule):
        check_counts("level size N_l", counts, 0)
        used = 0
        for row in counts.reshape(-1, counts.shape[-1]).tolist():
            real = max((l + 1 for l, n in enumerate(row) if n > 0), default=0)
            if real == 0 or any(n == 0 for n in row[:real]):
                raise ValueError(f"level sizes must be >= 1 (zeros only as trailing padding), got {tuple(row)}")
            used = max(used, real)
        last = check_repeats(repeats[:used].tolist())[-1]
        if any(int(r) != last for r in repeats[used:]):
            raise ValueError(f"padding levels repeat the last real level's r, got {tuple(repeats.tolist())}")
    return counts, repeats


def pad_schedule(schedule, levels):
    """`schedule` with empty levels appended up to `levels`: schedules of different depths then
    share one compiled program (their estimates and level stats are unchanged but padded)."""
    counts, repeats = (tuple(int(v) for v in part) for part in schedule)
    if levels < len(counts):
        raise ValueError(f"cannot pad a {len(counts)}-level schedule to {levels} levels")
    extra = levels - len(counts)
    return Schedule(counts + (0,) * extra, repeats + (repeats[-1],) * extra)


def as_runtime(schedule):
    """A schedule as int32 numpy arrays: passed to a jitted function, its entries are runtime
    values, so schedules of one length share one compiled program."""
    return Schedule(*(np.asarray(part, np.int32) for part in schedule))


def paper_schedule(eps, sigma, n, c=1.0, budget_constant=1.0):
    """The schedule of Algorithm 3: r_l = 1 + ceil(c n sigma^2 2^l) and
    N_l = max(2, ceil(budget_constant * 2^-l (L + 1) / eps^2)) for l = 0..L (at least 2 per side,
    so every level has a within-side variance), with L = ceil(2 log2(1/eps))
    so that the top level's plug-in bias, of order sqrt(n sigma^2 / r_L) = 2^(-L/2), is below eps.
    Levels whose r equals the previous level's are dropped: their increment is identically 0."""
    check_range("eps", eps, 0.0, 1.0, low_open=True, high_open=True)
    check_range("sigma", sigma, 0.0)
    check_range("c", c, 0.0, low_open=True)
    check_range("budget_constant", budget_constant, 0.0, low_open=True)
    n = check_positive_int("n", n)
    top = math.ceil(2 * math.log2(1 / eps))
    counts, repeats = [], []
    for level in range(top + 1):
        r = 1 + math.ceil(c * n * sigma**2 * 2**level)
        if repeats and r == repeats[-1]:
            continue
        repeats.append(r)
        counts.append(max(2, math.ceil(budget_constant * 2.0**-level * (top + 1) / eps**2)))
    return Schedule(tuple(counts), tuple(repeats))


def equal_share_schedule(budget, n, repeats, nearest=False):
    """Level sizes (per side) giving each level of `repeats` an equal share of `budget` queries:
    N_l proportional to 1 / (1 + 2 r_l). Rounded down (never over budget), or with nearest=True
    to the nearest integer and at least 1, as the paper's B.11 runner allocates its levels."""
    share = budget / len(repeats)
    if nearest:
        counts = tuple(max(1, round(share / cost.symmetric_queries(1, n, r))) for r in repeats)
    else:
        counts = tuple(cost.symmetric_pairs_for_budget(share, n, r) for r in repeats)
    return Schedule(counts, tuple(repeats))


def groups_for_confidence(delta):
    """Number of median-of-means groups for failure probability delta: ceil(8 ln(1/delta)), odd."""
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    groups = math.ceil(8 * math.log(1 / delta))
    return groups + (groups % 2 == 0)
