"""Access models: what an estimator may learn about p(x_i | x_<i) along a trajectory.

* `Exact()`        exact logits (Definition 1).
* `Noisy(sigma)`   noisy prefix distribution with relative variance sigma^2 (Definition 3): each
                   draw of the realized-token probability is p + sigma * sqrt(p (1 - p)) * N(0, 1),
                   unbiased and unclipped; the r-average is clipped to [1e-12, 1] before the log (B.2).
* `LogitNoise(s)`  softmax of the logits plus N(0, s^2) noise on every logit (Lemma 5).
* `Sampler()`      one-hot next-token draws (Definition 2); for the realized token a draw is Bernoulli(p).

Where the law of an r-average is known exactly (a Gaussian sum, a binomial count) it is drawn
directly, level by level with nested partial sums, so cost does not grow with r. Queries are still
counted as the oracle would answer them (`tvjax.core.cost`): n * r per trajectory and model.

Each oracle says its own noise level (`noise_level(pi, mu)`): the sigma the paper's schedule is
built for.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core.binomial import binomial
from tvjax.core.currency import LOG_FLOOR, Realized, log_clipped_mean
from tvjax.core.sharding import shard_rows
from tvjax.core.validate import check_range, is_concrete


def _pytree(cls, meta=("floor",)):
    data = [f.name for f in dataclasses.fields(cls) if f.name not in meta]
    return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=list(meta))


def _check_parameter(name, value):
    # Leaves may be tracers or placeholders inside jax transformations; check real numbers only.
    if isinstance(value, (int, float, np.ndarray, np.generic)) or (
        isinstance(value, jax.Array) and is_concrete(value)
    ):
        check_range(name, value, 0.0)


def _columns(a, positions):
    """a[:, positions] for static positions, as slices of consecutive runs: XLA's CPU gather costs
    about 100 ns per row here, slices nothing."""
    positions = np.asarray(positions, int)
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    runs = [(run[0], run[-1] + 1) for run in np.split(positions, breaks)]
    return jnp.concatenate([a[:, start:stop] for start, stop in runs], axis=1)


def _flat_draw(draw, key, shape):
    """draw(key, [size]) reshaped to `shape`: XLA's CPU random kernels run 3x slower on a narrow
    trailing axis (13 stochastic positions) than on one flat axis."""
    return draw(key, (int(np.prod(shape)),)).reshape(shape)


def _positions(process):
    """The positions where a draw can be random: the process's `stochastic_positions`, or all."""
    positions = getattr(process, "stochastic_positions", None)
    return np.arange(process.n) if positions is None else np.asarray(positions, int)


def _realized_probs(process, tokens):
    return jnp.exp(process.path_logprobs(tokens))


class _Oracle:
    """Shared driver. Subclasses give `_prepare(logp, process, trajectories)` (what the draws
    need, from the realized log-probs `logp` [positions, num] at the drawn positions; an oracle
    with `needs_tokens` reads the token trajectories too) and `_draw_sum(key, state, count)`:
    the sum of `count` realized-token probability draws per cell [positions, num], with `count`
    possibly traced (0 allowed); and
    `noise_level(pi, mu)`, the relative noise sigma of one draw that the paper's schedule is built
    for."""

    floor = 0.0
    draws = True  # whether scoring draws random numbers (exact logits do not)
    # Whether Algorithm 3 compiles a separate branch for chunks of first-level rows, which need
    # one drawn sum per cell rather than the coupled pair (most chunks: the coarsest level has
    # most trajectories and the stream runs level after level). A second copy of the draw costs
    # compile time and memory: worth it for Gaussian sums, not for the exact binomial sampler.
    separate_first_level = True
    # Rows per chunk when an estimator's sizes are traced: padding wastes at most one chunk per
    # side, and each loop step costs tens of microseconds, so cheap rows want longer chunks.
    traced_chunk_rows = 256

    def row_size(self, process):
        """Floats held per trajectory while drawing (sizes the estimators' chunks): a drawn
        position's, or the whole path's when the trajectory comes as tokens."""
        compact = hasattr(process, "realized_sampler") and not self.needs_tokens
        return len(_positions(process)) if compact else process.n

    def _path(self, total, repeats):
        # total [..., positions, num]: the path's log r-average, summed over positions.
        return jnp.sum(log_clipped_mean(total, repeats, self.floor), axis=-2)

    # The oracle's draws need only the realized log-probs (not the tokens): trajectories may come
    # as `Realized` from a process that samples them compactly.
    needs_tokens = False

    def trajectory_sampler(self, sampler, models):
        """A function (key, num) -> `num` trajectories of `sampler` in the form
        `nested_path_logprobs` takes: `Realized` log-probs under `models` where the sampler can
        give them without tokens (`realized_sampler`: the block instance, one random word per
        trajectory and no [num, n] array) and the oracle needs no tokens, else the token array.
        Rows sharded over a trajectory mesh. Build it outside a chunk loop: its tables are."""
        compact = getattr(sampler, "realized_sampler", None)
        draw = None if compact is None or self.needs_tokens else compact(models)
        if draw is not None:
            return lambda key, num: draw(key, num).shard(shard_rows)
        return lambda key, num: shard_rows(sampler.sample(key, num))

    def side_sampler(self, models):
        """A function (key, num, side) -> `num` trajectories of models[side] (side a traced
        scalar, or one per row where the sides' compact sampler allows it), as
        `trajectory_sampler(models[side], models)` draws them from that key. Through one draw
        where the models' compact sampler takes every side (`realized_sampler(models,
        samplers=models)`): a program then holds one sampler, not one per side. Else a switch
        over the sides' samplers (side a scalar)."""
        compact = getattr(models[0], "realized_sampler", None)
        draw = None if compact is None or self.needs_tokens else compact(models, samplers=models)
        if draw is not None:
            return lambda key, num, side: draw(key, num, side).shard(shard_rows)
        per_side = [self.trajectory_sampler(model, models) for model in models]
        return lambda key, num, side: jax.lax.switch(side, [functools.partial(d, num=num) for d in per_side], key)

    def realize(self, models, tokens):
        """`Realized` log-probs of token trajectories [num, n] under `models`, at the positions
        where a draw can be random (a `Realized` passes through).

        A process may declare `stochastic_positions` (static indices outside which every
        conditional is 0 or 1 for any prefix). There a draw is exactly p, so those positions add
        the constant log(clip(p)) to every average and need no random numbers: on the paper's
        block instance 13 of 128 positions draw."""
        if isinstance(tokens, Realized):
            return tokens
        logprobs, zero_mass, log_path = [], [], []
        for process in models:
            logp = process.path_logprobs(tokens)
            log_path.append(jnp.sum(logp, axis=-1))
            positions = _positions(process)
            logprobs.append(_columns(logp, positions))
            fixed = np.setdiff1d(np.arange(process.n), positions)
            zeros = jnp.sum(jnp.isneginf(_columns(logp, fixed)), axis=-1, dtype=jnp.int32) if fixed.size else None
            zero_mass.append(jnp.zeros(tokens.shape[0], jnp.int32) if zeros is None else zeros)
        return Realized(tuple(logprobs), tuple(zero_mass), tuple(log_path))

    def nested_path_logprobs(self, key, models, trajectories, repeats):
        """One [num, L] array per model: column l is the path log-prob of the average of the
        first repeats[l] draws, nested (the same draws extended), independent between models.
        `trajectories` are tokens [num, n] or `Realized` (see `trajectory_sampler`).

        `repeats` is a sequence of L nondecreasing counts, each a static int, a traced scalar or
        per row ([num, 1]); a leading count of 0 gives an unused first column (a chunk's
        first-level rows). Every draw of every model comes from one random call: on XLA's CPU
        each call costs tens of microseconds whatever its size. Rows whose leading count is 0
        draw that sum anyway and scale it by 0: cheaper to compile and to run here than a
        branch that skips them."""
        realized = self.realize(models, trajectories)
        # Position major [positions, num]: XLA's CPU kernels vectorize along the long trajectory
        # axis, not along a dozen positions (about 20% faster per trajectory on the block instance).
        logprobs = [jnp.moveaxis(lp, 1, 0) for lp in realized.logprobs]
        states = [self._prepare(lp, process, trajectories) for lp, process in zip(logprobs, models)]
        cells = logprobs[0].shape
        # Per-row counts [num, 1] apply along the trajectory axis, last in the position-major cells.
        repeats = [r.reshape(1, -1) if jnp.ndim(r) == 2 else r for r in repeats]
        no_first = is_concrete(repeats[0]) and np.all(np.asarray(repeats[0]) == 0)
        increments = ([] if no_first else [repeats[0]]) + [b - a for a, b in zip(repeats, repeats[1:])]
        # [models, increments, positions, num]: sums of increments[j] draws, one random call.
        full = (len(models), len(increments)) + cells
        count = jnp.broadcast_to(jnp.stack([jnp.broadcast_to(c, cells) for c in increments]), full)
        state = jax.tree.map(lambda *a: jnp.broadcast_to(jnp.stack(a)[:, None], full + a[0].shape[2:]), *states)
        sums = self._draw_sum(key, state, count)
        # The nested totals as plain adds over the few increments: XLA's CPU cumsum is a
        # reduce-window kernel of its own to compile.
        totals = [jnp.zeros_like(sums[:, 0])] if no_first else []
        for j in range(len(increments)):
            totals.append(sums[:, j] if j == 0 and not no_first else totals[-1] + sums[:, j])
        columns = jnp.stack([self._path(totals[l], jnp.maximum(r, 1)) for l, r in enumerate(repeats)], -1)
        return [f[:, None] + column for f, column in zip(realized.fixed_logprobs(self.floor), columns)]


@dataclasses.dataclass(frozen=True)
class Exact(_Oracle):
    """Exact prefix logits: every repeat returns the true probability."""

    floor: float = 0.0
    draws = False
    separate_first_level = False  # nothing drawn: one branch
    # Exact rows are cheap (on the block instance one random word each): long chunks amortize
    # the loop's per-step cost, each of a step's few dozen kernels paying its own launch (a
    # quarter of Figure 5's runs at 16384 rows). Token trajectories stay within memory_chunk.
    traced_chunk_rows = 65536

    def nested_path_logprobs(self, key, models, trajectories, repeats):
        if isinstance(trajectories, Realized):
            paths = trajectories.log_path
        else:
            paths = [jnp.sum(process.path_logprobs(trajectories), axis=-1) for process in models]
        return [jnp.repeat(path[:, None], len(repeats), axis=1) for path in paths]

    def noise_level(self, pi, mu):
        return 0.0

    def draw_probs(self, key, process, tokens, num_draws):
        p = _realized_probs(process, tokens)
        return jnp.repeat(p[..., None], num_draws, axis=-1)

    def draw_distributions(self, key, process, tokens, num_draws):
        probs = jnp.exp(process.next_token_logprobs(tokens))
        return jnp.repeat(probs[..., None, :], num_draws, axis=-2)


@dataclasses.dataclass(frozen=True)
class Noisy(_Oracle):
    """Gaussian noisy prefix distribution with relative variance sigma^2 (paper B.2)."""

    sigma: float = 0.0
    traced_chunk_rows = 2048
    floor: float = LOG_FLOOR

    def __post_init__(self):
        _check_parameter("sigma", self.sigma)

    def noise_level(self, pi, mu):
        return float(self.sigma)

    def _prepare(self, logp, process, trajectories):
        p = jnp.exp(logp)
        return p, self.sigma * jnp.sqrt(p * (1.0 - p))

    def _draw_sum(self, key, state, count):
        # The sum of `count` independent Gaussian draws, drawn directly: N(count p, count sd^2).
        p, sd = state
        return count * p + sd * jnp.sqrt(count) * _flat_draw(jax.random.normal, key, p.shape)

    def draw_probs(self, key, process, tokens, num_draws):
        p = _realized_probs(process, tokens)[..., None]
        noise = jax.random.normal(key, p.shape[:-1] + (num_draws,))
        return p + self.sigma * jnp.sqrt(p * (1.0 - p)) * noise

    def draw_distributions(self, key, process, tokens, num_draws):
        """Vector draws P + sigma * e with Cov(e) = diag(P) - P P^T: the realized coordinate has
        the scalar oracle's law, each draw sums to 1, and zero-mass tokens stay at zero."""
        probs = jnp.exp(process.next_token_logprobs(tokens))[..., None, :]
        shape = probs.shape[:-2] + (num_draws, probs.shape[-1])
        w = jnp.sqrt(probs) * jax.random.normal(key, shape)
        return probs + self.sigma * (w - probs * jnp.sum(w, axis=-1, keepdims=True))


@dataclasses.dataclass(frozen=True)
class Sampler(_Oracle):
    """Prefix sampler: the r-average of one-hot draws at the realized token is Binomial(r, p) / r.

    The r-average gets the same [1e-12, 1] guard as Noisy (paper B.2), so a position where both
    sides saw zero hits cancels instead of forcing Z = 1.
    """

    floor: float = LOG_FLOOR
    # A second copy of the binomial sampler: 1.4 s more compiling and about 55 MB more peak memory
    # on B.11 (past 400 MB) for 0.2-0.5 s less of its runs.
    separate_first_level = False

    def noise_level(self, pi, mu):
        # Lemma 4: a prefix sampler is a noisy oracle with sigma^2 <= K, the largest support.
        return math.sqrt(max(pi.max_support, mu.max_support))

    def _prepare(self, logp, process, trajectories):
        return jnp.exp(logp)

    def _draw_sum(self, key, p, count):
        # An exact sampler whose loops run only over the cells still open (tvjax.core.binomial), not
        # jax.random.binomial's inversion and rejection loops over every cell.
        return binomial(key, count, p).astype(p.dtype)

    def draw_probs(self, key, process, tokens, num_draws):
        p = _realized_probs(process, tokens)[..., None]
        return jax.random.bernoulli(key, p, p.shape[:-1] + (num_draws,)).astype(jnp.float32)

    def draw_distributions(self, key, process, tokens, num_draws):
        logprobs = process.next_token_logprobs(tokens)
        shape = (num_draws,) + logprobs.shape[:-1]
        picks = jax.random.categorical(key, logprobs, shape=shape)
        return jnp.moveaxis(jax.nn.one_hot(picks, logprobs.shape[-1]), 0, -2)


@dataclasses.dataclass(frozen=True)
class LogitNoise(_Oracle):
    """softmax(logits + scale * N(0, I)) at each query (Lemma 5); -inf logits stay -inf.

    Its draws are unbiased for the smoothed distribution E[softmax(logits + noise)], not for p
    itself; identical processes behind it still have TV 0. Cost grows with r (no closed form).
    """

    scale: float = 0.0
    floor: float = 0.0

    def __post_init__(self):
        _check_parameter("scale", self.scale)

    def noise_level(self, pi, mu):
        # Lemma 5, to first order: the logit noise scale acts as the relative noise level.
        return float(self.scale)

    def row_size(self, process):
        return process.n * process.vocab_size

    needs_tokens = True

    def _prepare(self, logp, process, tokens):
        # The whole next-token rows and the realized tokens at the drawn positions, position major.
        select = lambda a: jnp.moveaxis(_columns(a, _positions(process)), 1, 0)
        return select(process.next_token_logprobs(tokens)), select(tokens)

    def _one_draw(self, key, logprobs, tokens):
        noisy = jax.nn.log_softmax(logprobs + self.scale * jax.random.normal(key, logprobs.shape), -1)
        return jnp.exp(jnp.take_along_axis(noisy, tokens[..., None], axis=-1)[..., 0])

    def _draw_sum(self, key, state, count):
        # `count` may differ per row ([num, 1]): run to the largest and keep draw j where j < count.
        logprobs, tokens = state
        count = jnp.broadcast_to(count, tokens.shape)
        body = lambda j, acc: acc + jnp.where(j < count, self._one_draw(jax.random.fold_in(key, j), logprobs, tokens), 0.0)
        return jax.lax.fori_loop(0, jnp.max(count), body, jnp.zeros(tokens.shape))

    def draw_probs(self, key, process, tokens, num_draws):
        logprobs = process.next_token_logprobs(tokens)
        draws = jax.vmap(lambda k: self._one_draw(k, logprobs, tokens))(jax.random.split(key, num_draws))
        return jnp.moveaxis(draws, 0, -1)

    def draw_distributions(self, key, process, tokens, num_draws):
        logprobs = process.next_token_logprobs(tokens)[..., None, :]
        noise = jax.random.normal(key, logprobs.shape[:-2] + (num_draws, logprobs.shape[-1]))
        return jax.nn.softmax(logprobs + self.scale * noise, axis=-1)


for _cls in (Exact, Noisy, Sampler, LogitNoise):
    _pytree(_cls)

ACCESS_MODELS = {"exact": Exact, "noisy": Noisy, "logit_noise": LogitNoise, "sampler": Sampler}
