"""Split, train, count: the certified lower bound from a trained distinguisher.

Each side's rows are permuted with the key and cut into a test part (`test_fraction`) and a
training part, whose last `validation_fraction` is the validation slice. The classifier is fit
on the training rows of both sides (a class-balanced logistic loss, optax AdamW, minibatches
reshuffled every epoch), evaluated on the validation slice after every epoch, and the parameters
of the best validation loss are kept; training stops after `patience` epochs without improvement
or at `max_epochs`. The event A = {logit > threshold} (threshold 0, or with `tune_threshold` the
cut that maximizes pi_hat(A) - mu_hat(A) on the validation slice) is then counted on the test rows.

The whole of it is one jitted function of (key, tokens, lengths) with static sizes, vmapped over
copies by `distinguish_copies`; the bound itself (`bounds.tv_lower_bound`) is float64 host code.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tvjax.audit.bounds import tv_lower_bound
from tvjax.audit.distinguish.classifiers import CLASSIFIERS
from tvjax.audit.distinguish.samples import TokenSamples, check_sample_pair, sample_pair, text_pair
from tvjax.core.programs import jit_program
from tvjax.core.validate import check_positive_int, check_range

DEFAULT_LEARNING_RATES = {"ngram": 0.02, "transformer": 3e-3}
DEFAULT_OPTIMIZERS = {"ngram": "sgd", "transformer": "adamw"}
OPTIMIZERS = {
    "adamw": lambda lr, decay: optax.adamw(lr, weight_decay=decay),
    "sgd": lambda lr, decay: optax.chain(optax.add_decayed_weights(decay), optax.sgd(lr, momentum=0.9)),
    "adagrad": lambda lr, decay: optax.chain(optax.add_decayed_weights(decay), optax.adagrad(lr)),
}


class TrainSettings(NamedTuple):
    """How the samples are split and the classifier trained (static: one compiled program per value).
    learning_rate None: DEFAULT_LEARNING_RATES of the classifier; options: the classifier's keywords
    (e.g. {"order": 2} for "ngram", {"width": 64, "blocks": 2} for "transformer")."""

    test_fraction: float = 0.5
    validation_fraction: float = 0.25
    batch_size: int = 256
    max_epochs: int = 100
    patience: int = 5
    learning_rate: float | None = None
    weight_decay: float = 1e-4
    optimizer: str | None = None
    tune_threshold: bool = False
    options: dict | None = None


class SplitSizes(NamedTuple):
    """Rows of one side in each part: test (held out), validation and fit (the training half)."""

    test: int
    validation: int
    fit: int


class DistinguisherResult(NamedTuple):
    """The certified bound and what it rests on. `lower_bound`: TV >= lower_bound with probability
    >= 1 - delta (may be negative: then it certifies TV >= 0 only); `estimate` = pi_rate - mu_rate,
    the test frequencies of A = {classifier says pi}; `pi_hits` / `mu_hits` of `pi_test` / `mu_test`
    test rows; training diagnostics: `epochs` run, `best_epoch`, `best_validation_loss`,
    `best_validation_accuracy` (class-balanced, at logit 0), `stopped_early` (before max_epochs),
    `threshold` of the logit. Fields are arrays with a leading copies axis from `distinguish_copies`."""

    lower_bound: float
    estimate: float
    pi_rate: float
    mu_rate: float
    pi_hits: int
    mu_hits: int
    pi_test: int
    mu_test: int
    pi_train: int
    mu_train: int
    delta: float
    classifier: str
    epochs: int
    best_epoch: int
    best_validation_loss: float
    best_validation_accuracy: float
    stopped_early: bool
    threshold: float


def split_sizes(num, test_fraction=0.5, validation_fraction=0.25):
    """SplitSizes of `num` rows: test = floor(num test_fraction), validation = ceil of its share of
    the rest; every part needs a row, else a ValueError saying how many rows are needed."""
    check_range("test_fraction", test_fraction, 0.0, 1.0, low_open=True, high_open=True)
    check_range("validation_fraction", validation_fraction, 0.0, 1.0, low_open=True, high_open=True)
    parts = lambda m: (math.floor(m * test_fraction), math.ceil((m - math.floor(m * test_fraction)) * validation_fraction))
    test, validation = parts(num)
    if test < 1 or validation < 1 or num - test - validation < 1:
        needed = next(m for m in range(3, 10**9) if min(parts(m)) >= 1 and m - sum(parts(m)) >= 1)
        raise ValueError(f"{num} samples on a side are too few to split into test, validation and fit rows at "
                         f"test_fraction={test_fraction}, validation_fraction={validation_fraction}: "
                         f"need at least {needed} per side")
    return SplitSizes(test, validation, num - test - validation)


def split_indices(key, num, sizes):
    """(test, validation, fit) row indices of one side: a permutation by `key` cut at `sizes`."""
    order = jax.random.permutation(key, num)
    return order[: sizes.test], order[sizes.test : sizes.test + sizes.validation], order[sizes.test + sizes.validation :]


def _as_key(key):
    """A jax PRNG key from a key or an integer seed."""
    return jax.random.key(key) if isinstance(key, (int, np.integer)) else key


def _side_keys(key):
    """Keys of (pi split, mu split, initialization, shuffling): the split keys are used for nothing else."""
    return jax.random.split(key, 4)


def held_out_rows(key, num_pi, num_mu, settings=None):
    """(pi test rows, mu test rows): the row indices `distinguish(key, ...)` holds out on sample sets
    of num_pi and num_mu rows, which nothing but the final count reads."""
    key = _as_key(key)
    settings = settings or TrainSettings()
    key_pi, key_mu = _side_keys(key)[:2]
    return tuple(np.asarray(split_indices(k, num, split_sizes(num, settings.test_fraction, settings.validation_fraction))[0])
                 for k, num in ((key_pi, num_pi), (key_mu, num_mu)))


def _balanced_loss(logits, labels, weights):
    return jnp.sum(weights * optax.sigmoid_binary_cross_entropy(logits, labels)) / jnp.maximum(jnp.sum(weights), 1e-12)


def _rates(logits_pi, logits_mu, threshold):
    return jnp.mean(logits_pi > threshold), jnp.mean(logits_mu > threshold)


def _best_cut(logits_pi, logits_mu):
    """The threshold t maximizing mean(logits_pi > t) - mean(logits_mu > t): a midpoint between
    consecutive distinct sorted logits (or below all of them)."""
    values = jnp.concatenate([logits_pi, logits_mu])
    gain = jnp.concatenate([jnp.full(logits_pi.shape, 1 / logits_pi.size), jnp.full(logits_mu.shape, -1 / logits_mu.size)])
    order = jnp.argsort(-values)
    ranked, score = values[order], jnp.cumsum(gain[order])  # A = the top i + 1 logits
    cut = jnp.append(ranked[1:] < ranked[:-1], True)  # only between distinct values
    best = jnp.argmax(jnp.where(cut, score, -jnp.inf))
    below = jnp.append(ranked[1:], ranked[-1] - 1.0)[best]
    return (ranked[best] + below) / 2


def _train_and_count(key, pi_tokens, pi_lengths, mu_tokens, mu_lengths, *, classifier, vocab_size, settings, sizes):
    """(test hits of pi, of mu, diagnostics) for one pair of sample sets; jittable and vmappable."""
    n = pi_tokens.shape[1]
    key_pi, key_mu, key_init, key_shuffle = _side_keys(key)
    parts = [split_indices(k, t.shape[0], s) for k, t, s in zip((key_pi, key_mu), (pi_tokens, mu_tokens), sizes)]
    sides = ((pi_tokens, pi_lengths), (mu_tokens, mu_lengths))
    rows = lambda side, part: tuple(array[parts[side][part]] for array in sides[side])  # (tokens, lengths)
    (test_pi, test_pi_len), (test_mu, test_mu_len) = rows(0, 0), rows(1, 0)
    (val_pi, val_pi_len), (val_mu, val_mu_len) = rows(0, 1), rows(1, 1)
    (fit_pi, fit_pi_len), (fit_mu, fit_mu_len) = rows(0, 2), rows(1, 2)

    fit_tokens = jnp.concatenate([fit_pi, fit_mu])
    fit_lengths = jnp.concatenate([fit_pi_len, fit_mu_len])
    fit_labels = jnp.concatenate([jnp.ones(sizes[0].fit), jnp.zeros(sizes[1].fit)])
    total = sizes[0].fit + sizes[1].fit
    fit_weights = jnp.concatenate([jnp.full(sizes[0].fit, total / (2 * sizes[0].fit)),
                                   jnp.full(sizes[1].fit, total / (2 * sizes[1].fit))])
    val_tokens = jnp.concatenate([val_pi, val_mu])
    val_lengths = jnp.concatenate([val_pi_len, val_mu_len])
    val_labels = jnp.concatenate([jnp.ones(sizes[0].validation), jnp.zeros(sizes[1].validation)])
    val_weights = jnp.concatenate([jnp.full(sizes[0].validation, 0.5 / sizes[0].validation),
                                   jnp.full(sizes[1].validation, 0.5 / sizes[1].validation)])

    options = dict(settings.options or {})
    model = CLASSIFIERS[classifier](vocab_size, n, rngs=nnx.Rngs(params=key_init), **options)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    logits_of = lambda p, tokens, lengths: nnx.merge(graphdef, p, rest)(tokens, lengths)
    learning_rate = settings.learning_rate or DEFAULT_LEARNING_RATES[classifier]
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), OPTIMIZERS[settings.optimizer or DEFAULT_OPTIMIZERS[classifier]](
        learning_rate, settings.weight_decay))

    batch = min(settings.batch_size, total)
    num_batches = -(-total // batch)

    def step(carry, batch_rows):
        p, opt_state = carry
        index, valid = batch_rows
        loss_of = lambda q: _balanced_loss(logits_of(q, fit_tokens[index], fit_lengths[index]), fit_labels[index],
                                           fit_weights[index] * valid)
        grads = jax.grad(loss_of)(p)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), None

    def validation_loss(p):
        return _balanced_loss(logits_of(p, val_tokens, val_lengths), val_labels, val_weights)

    def epoch(state):
        p, opt_state, best, best_loss, best_epoch, count, _ = state
        order = jax.random.permutation(jax.random.fold_in(key_shuffle, count), total)
        padded = jnp.concatenate([order, jnp.zeros(num_batches * batch - total, order.dtype)])
        valid = (jnp.arange(num_batches * batch) < total).astype(jnp.float32)
        (p, opt_state), _ = jax.lax.scan(step, (p, opt_state), (padded.reshape(num_batches, batch),
                                                                valid.reshape(num_batches, batch)))
        loss = validation_loss(p)
        better = loss < best_loss
        best = jax.tree.map(lambda new, old: jnp.where(better, new, old), p, best)
        best_epoch = jnp.where(better, count + 1, best_epoch)
        return p, opt_state, best, jnp.minimum(loss, best_loss), best_epoch, count + 1, count + 1 - best_epoch

    def keep_going(state):
        return (state[5] < settings.max_epochs) & (state[6] < settings.patience)

    start = (params, optimizer.init(params), params, validation_loss(params), jnp.int32(0), jnp.int32(0), jnp.int32(0))
    _, _, best, best_loss, best_epoch, epochs, since_best = jax.lax.while_loop(keep_going, epoch, start)

    val_logits_pi, val_logits_mu = logits_of(best, val_pi, val_pi_len), logits_of(best, val_mu, val_mu_len)
    threshold = _best_cut(val_logits_pi, val_logits_mu) if settings.tune_threshold else jnp.float32(0.0)
    val_pi_rate, val_mu_rate = _rates(val_logits_pi, val_logits_mu, 0.0)
    pi_hits = jnp.sum(logits_of(best, test_pi, test_pi_len) > threshold)
    mu_hits = jnp.sum(logits_of(best, test_mu, test_mu_len) > threshold)
    diagnostics = {"epochs": epochs, "best_epoch": best_epoch, "best_validation_loss": best_loss,
                   "best_validation_accuracy": 0.5 + (val_pi_rate - val_mu_rate) / 2,
                   "stopped_early": since_best >= settings.patience, "threshold": threshold}
    return pi_hits, mu_hits, diagnostics


def _check_settings(classifier, settings):
    settings = TrainSettings() if settings is None else settings
    if classifier not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {classifier!r}; choose one of {sorted(CLASSIFIERS)}")
    if not isinstance(settings, TrainSettings):
        raise TypeError(f"settings must be a TrainSettings, got {type(settings).__name__}")
    for name in ("batch_size", "max_epochs", "patience"):
        check_positive_int(name, getattr(settings, name))
    if settings.learning_rate is not None:
        check_range("learning_rate", settings.learning_rate, 0.0, low_open=True)
    check_range("weight_decay", settings.weight_decay, 0.0)
    # static arguments are hashed: the classifier options as a sorted tuple
    return settings._replace(options=tuple(sorted(dict(settings.options or {}).items())) or None)


def _program(key, pi_tokens, pi_lengths, mu_tokens, mu_lengths, *, classifier, vocab_size, settings, sizes):
    return _train_and_count(key, pi_tokens, pi_lengths, mu_tokens, mu_lengths, classifier=classifier,
                            vocab_size=vocab_size, settings=settings, sizes=sizes)


@functools.cache
def _compiled(fn, static_argnames, fast_compile):
    """`fn` jitted with the project's XLA options (`tvjax.core.programs.jit_program`); fast_compile
    lowers XLA's backend optimization (several times faster compiles, slower runs: small jobs)."""
    return jit_program(fn, fast_compile, static_argnames)


def _result(pi_hits, mu_hits, diagnostics, sizes, delta, classifier):
    """DistinguisherResult from the counts (scalars, or a leading copies axis)."""
    pi_hits, mu_hits = np.asarray(pi_hits), np.asarray(mu_hits)
    pi_test, mu_test = sizes[0].test, sizes[1].test
    bound = np.vectorize(lambda a, b: tv_lower_bound(int(a), pi_test, int(b), mu_test, delta), otypes=[float])(pi_hits, mu_hits)
    pi_rate, mu_rate = pi_hits / pi_test, mu_hits / mu_test
    d = {name: np.asarray(value) for name, value in diagnostics.items()}
    scalar = pi_hits.ndim == 0
    as_out = (lambda v, kind: kind(v)) if scalar else (lambda v, kind: v)
    return DistinguisherResult(
        as_out(bound, float), as_out(pi_rate - mu_rate, float), as_out(pi_rate, float), as_out(mu_rate, float),
        as_out(pi_hits, int), as_out(mu_hits, int), pi_test, mu_test, sizes[0].validation + sizes[0].fit,
        sizes[1].validation + sizes[1].fit, float(delta), classifier, as_out(d["epochs"], int),
        as_out(d["best_epoch"], int), as_out(d["best_validation_loss"], float),
        as_out(d["best_validation_accuracy"], float), as_out(d["stopped_early"], bool), as_out(d["threshold"], float))


def _prepare(pi, mu, classifier, delta, settings):
    check_sample_pair(pi, mu)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    settings = _check_settings(classifier, settings)
    sizes = tuple(split_sizes(side.tokens.shape[0], settings.test_fraction, settings.validation_fraction)
                  for side in (pi, mu))
    return settings, sizes


def distinguish(key, pi, mu, *, classifier="ngram", delta=0.05, settings=None, fast_compile=False):
    """A certified lower bound on TV(pi, mu) from two sample sets (`TokenSamples`, e.g. from
    `token_samples`, `texts_to_samples`, `sample_pair` or `pool_samples`).

    `key` (a jax PRNG key, or an int seed) splits each side's rows into a held-out test part and a
    training part (see the module docstring; `settings`, a TrainSettings or None for the defaults,
    says how); a classifier ("ngram" or "transformer") is trained on the training part only, with
    early stopping on its validation slice, and fixes the event A = {logit > threshold}.
    `fast_compile` compiles at XLA's optimization level 0 (for small sample sets).

    Why the bound holds: given the training rows, A is fixed. The test rows are independent draws
    that neither training, early stopping nor the threshold read, so pi_hits ~ Binomial(pi_test,
    pi(A)) and mu_hits ~ Binomial(mu_test, mu(A)), independent of each other. The Clopper-Pearson
    lower bound on pi(A) at delta / 2 exceeds pi(A) with probability <= delta / 2, the upper bound
    on mu(A) at delta / 2 falls below mu(A) with probability <= delta / 2; so (union bound) their
    difference `lower_bound` (`tv_lower_bound`) is <= pi(A) - mu(A) <= TV(pi, mu) with probability
    >= 1 - delta, conditionally on the training rows and hence overall.
    """
    settings, sizes = _prepare(pi, mu, classifier, delta, settings)
    key = _as_key(key)
    program = _compiled(_program, ("classifier", "vocab_size", "settings", "sizes"), bool(fast_compile))
    pi_hits, mu_hits, diagnostics = program(key, pi.tokens, pi.lengths, mu.tokens, mu.lengths, classifier=classifier,
                                            vocab_size=pi.vocab_size, settings=settings, sizes=sizes)
    return _result(pi_hits, mu_hits, diagnostics, sizes, delta, classifier)


def distinguish_texts(key, texts_pi, texts_mu, tokenizer, *, classifier="ngram", delta=0.05, settings=None):
    """`distinguish` on two sides' texts (from text-only endpoints), encoded by `tokenizer`
    (`ByteTokenizer()` when the endpoint's tokenizer is unknown)."""
    pi, mu = text_pair(texts_pi, texts_mu, tokenizer)
    return distinguish(key, pi, mu, classifier=classifier, delta=delta, settings=settings)


def _copy_keys(key, copies):
    """Per copy (sampling key, training key)."""
    keys = jax.vmap(jax.random.split)(jax.random.split(key, copies))
    return keys[:, 0], keys[:, 1]


def copy_samples(key, pi, mu, num_per_side, copies):
    """The samples `distinguish_copies(key, pi, mu, num_per_side, copies)` trains and tests on: a
    (pi, mu) pair of TokenSamples with a leading copies axis (to run another test on the same rows)."""
    key = _as_key(key)
    sample_keys, _ = _copy_keys(key, check_positive_int("copies", copies))
    num = check_positive_int("num_per_side", num_per_side)
    rows = jax.jit(jax.vmap(lambda k: [side[:2] for side in sample_pair(k, pi, mu, num)]))(sample_keys)
    return tuple(TokenSamples(*side, int(process.vocab_size)) for side, process in zip(rows, (pi, mu)))


def _copies_program(key, pi, mu, *, num_per_side, copies, classifier, settings, sizes):
    def one(k_samples, k_train):
        a, b = sample_pair(k_samples, pi, mu, num_per_side)
        return _train_and_count(k_train, a.tokens, a.lengths, b.tokens, b.lengths, classifier=classifier,
                                vocab_size=int(pi.vocab_size), settings=settings, sizes=sizes)

    return jax.vmap(one)(*_copy_keys(key, copies))


def distinguish_copies(key, pi, mu, num_per_side, copies, *, classifier="ngram", delta=0.05, settings=None,
                       fast_compile=False):
    """`copies` independent runs of `distinguish` on fresh samples of the processes pi and mu
    (`num_per_side` each, drawn in JAX), in one vmapped program: a DistinguisherResult whose
    per-run fields are arrays [copies]. For validity and power studies on synthetic pairs."""
    copies = check_positive_int("copies", copies)
    num = check_positive_int("num_per_side", num_per_side)
    probe = TokenSamples(jnp.zeros((num, pi.n), jnp.int32), jnp.zeros(num, jnp.int32), int(pi.vocab_size))
    settings, sizes = _prepare(probe, probe._replace(vocab_size=int(mu.vocab_size)), classifier, delta, settings)
    key = _as_key(key)
    program = _compiled(_copies_program, ("num_per_side", "copies", "classifier", "settings", "sizes"), bool(fast_compile))
    pi_hits, mu_hits, diagnostics = program(key, pi, mu, num_per_side=num, copies=copies, classifier=classifier,
                                            settings=settings, sizes=sizes)
    return _result(pi_hits, mu_hits, diagnostics, sizes, delta, classifier)
