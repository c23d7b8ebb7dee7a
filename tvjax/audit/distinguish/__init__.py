"""Certified TV lower bounds from samples alone: a trained distinguisher on text-only endpoints.

For any event A, TV(pi, mu) >= pi(A) - mu(A). A classifier trained on one part of two sample
sets fixes A = {classifier says pi}; the held-out rest counts it, and exact binomial (Clopper-
Pearson) bounds on the two independent counts give a lower bound on TV that holds with
probability >= 1 - delta. Nothing but samples is needed: no log-probabilities.

    from tvjax.audit.distinguish import distinguish, sample_pair
    pi_samples, mu_samples = sample_pair(jax.random.key(0), pi, mu, num_per_side=2000)
    result = distinguish(jax.random.key(1), pi_samples, mu_samples, classifier="ngram", delta=0.05)
    result.lower_bound, result.estimate      # TV >= lower_bound at confidence 95%

Modules:
  (tvjax.audit.bounds: clopper_pearson_lower / _upper, tv_lower_bound, shared with the reference audit)
  samples:     TokenSamples and its sources: arrays, texts + tokenizer, processes, pools
  classifiers: NgramClassifier (hashed k-gram logistic regression), TransformerClassifier (Flax NNX)
  train:       split_sizes / split_indices / held_out_rows, distinguish, distinguish_copies (vmapped seeds)
"""

from tvjax._extras import require

for _package in ("flax", "optax"):
    require(_package, "models", "the trained distinguishers")

from tvjax.audit.bounds import clopper_pearson_lower, clopper_pearson_upper, tv_lower_bound
from tvjax.audit.distinguish.classifiers import CLASSIFIERS, NgramClassifier, TransformerClassifier, ngram_features
from tvjax.audit.distinguish.samples import (
    ByteTokenizer,
    TokenSamples,
    check_sample_pair,
    pool_samples,
    sample_pair,
    sample_process,
    text_pair,
    texts_to_samples,
    token_samples,
)
from tvjax.audit.distinguish.train import (
    DEFAULT_LEARNING_RATES,
    DistinguisherResult,
    SplitSizes,
    TrainSettings,
    copy_samples,
    distinguish,
    distinguish_copies,
    distinguish_texts,
    held_out_rows,
    split_indices,
    split_sizes,
)

__all__ = ["clopper_pearson_lower", "clopper_pearson_upper", "tv_lower_bound", "CLASSIFIERS", "NgramClassifier",
           "TransformerClassifier", "ngram_features", "ByteTokenizer", "TokenSamples", "check_sample_pair",
           "pool_samples", "sample_pair", "sample_process", "text_pair", "texts_to_samples", "token_samples",
           "DEFAULT_LEARNING_RATES", "DistinguisherResult", "SplitSizes", "TrainSettings", "copy_samples",
           "distinguish", "distinguish_copies", "distinguish_texts", "held_out_rows", "split_indices", "split_sizes"]
