"""The JAX model (tvjax.models) as an engine of experiments/engine_campaign.py (`engine@pi=jax`).

The bridge of the engine worker's kind "jax" (`python -m tvjax.engines.worker JOB.json`, run with
the base venv's Python): it samples and replay-scores into the same pool format as the
transformers, vLLM and SGLang bridges, so JAX/XLA is compared with them in one pool report. It
imports JAX, so it lives outside `tvjax.engines` (whose modules run in the engines' venvs).

Engine config keys (configs/engine/jax.yaml):
  model: 'smollm2' | a .gguf file (read directly, dequantized to float32) | a Hugging Face folder
  dtype: float32 | bfloat16 | float16  (the compute dtype)
  top_k: int | null           (tie-inclusive truncation; null = none)
  platform: null | cpu | cuda | tpu  (null: JAX's default backend; set before JAX starts a backend)
  variant: {}                 (further `LanguageModel.variant` keywords, applied after top_k and dtype:
                               weights, kv_cache_dtype, attention_chunk, ... (tvjax.models.Serving))
  eos: suppress | stop        (tvjax.engines.protocol.Eos: `language_model(..., eos=...)`; under
                               stop a row ends at its first EOS and the decode loop pads it)

Every step, of sampling and of replay alike, reads the raw logits of the KV-cached decode loop
(the prompt's cache shared by every row, one batch of all N rows, served as the LanguageModel's
`serving`: a variant's weight format, KV-cache dtype and attention chunking apply to both) and
turns them into the sampling distribution of `tvjax.models.sampling_logprobs`: EOS ids set to
-inf before any truncation (eos=suppress; under eos=stop they keep their mass and a row past its
EOS gets the pad's distribution, whose positions the worker stores as the pad), log-softmax
renormalized over the tie-inclusive top-k set (-inf outside it), at temperature 1 unless
`variant` says otherwise -- the distribution that `tvjax.engines.replay.topk_logprobs` computes
for the torch bridges.

* `sample` draws with `jax.random.key(seed)` exactly as `LanguageModel.sample` does (same keys,
  same draws: the same tokens), and records each drawn token's log-probability at sampling time.
* `replay` runs the same decode loop with each step's token forced to the trajectory's (the
  record is taken from the step's logits before the forcing), and records the realized token's
  log-probability and the renormalized top-w readout (w = the pool's top_k).
* `sequence_score` is the second, non-default scorer: one teacher-forced pass per chunk of rows
  (`LanguageModel.next_token_logprobs`, the prefill path).

Determinism: this engine computes exact logits of a fixed program; the replay seed is unused and
every one of the R passes gives the same values (bit-identical on CPU, where XLA's reductions are
deterministic). That is the honest answer of an exact-logit engine, not a missing noise model: its
self-noise sigma is 0, as that of transformers and vLLM-CPU measured here.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from tvjax._extras import require
from tvjax.engines.models import resolve
from tvjax.engines.protocol import EngineError, Sampled, Scored, check_replayed, collect_sampled, eos_policy
from tvjax.models import decode_loop, draw_token, language_model, load_gguf, load_hf_folder, tokenizer_from_gguf, top_k
from tvjax.models.process import in_row_chunks
from tvjax.models.tokenizer import tokenizer_from_folder
from tvjax.models.weights import gguf_metadata


class TemplateTokenizer:
    """A tvjax.models ChatTokenizer behind the two things the worker asks of an engine's tokenizer
    (`tvjax.engines.tokens.prompt_ids`: `apply_chat_template`; `eos_token_id`)."""

    def __init__(self, chat):
        if chat is None:
            raise EngineError("this model has no tokenizer: the jax engine needs one for the chat template")
        self.chat = chat

    @property
    def eos_token_id(self):
        return self.chat.eos_ids[0] if self.chat.eos_ids else None

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False):
        text = self.chat.render_chat(messages, add_generation_prompt)
        return self.chat.encode(text) if tokenize else text


def load_model(model: str):
    """A LoadedModel from a model spec: 'smollm2' or a .gguf file (read directly), or a folder."""
    folder, gguf = resolve(model)
    return load_gguf(folder / gguf) if gguf is not None else load_hf_folder(folder)


def model_eos_ids(model: str) -> list[int]:
    """The EOS ids of a model spec as this engine reads them (its tokenizer's), without the weights."""
    folder, gguf = resolve(model)
    if gguf is not None:
        gguf_lib = require("gguf", "models", "GGUF files")
        tokenizer = tokenizer_from_gguf(gguf_metadata(gguf_lib.GGUFReader(str(folder / gguf))))
    else:
        tokenizer = tokenizer_from_folder(folder, json.loads((folder / "config.json").read_text()).get("eos_token_id"))
    return sorted({int(e) for e in tokenizer.eos_ids})


@functools.partial(jax.jit, static_argnums=(3, 4))
def _decode(lm, key, targets, width, force):
    """`LanguageModel.sample`'s decode loop (the same keys and draws), recording at every step the
    realized token's log-probability and the top-`width` readout of the sampling distribution.

    force=False draws x_t (targets only gives the shape); force=True feeds targets [num, n].
    Returns tokens int32 [num, n], realized float32 [num, n], ids int32 [num, n, w], values [num, n, w].
    """

    def record(k, logprobs, target):
        token = target if force else draw_token(k, logprobs)
        values, ids = top_k(logprobs, width)
        realized = jnp.take_along_axis(logprobs, token[:, None], axis=-1)[:, 0]
        return token, (token, realized, ids, values)

    return decode_loop(lm, key, targets, record)


@functools.partial(jax.jit, static_argnums=2)
def _sequence(lm, tokens, width):
    def readout(rows):
        logprobs = lm.next_token_logprobs(rows)
        values, ids = top_k(logprobs, width)
        return jnp.take_along_axis(logprobs, rows[..., None], axis=-1)[..., 0], ids, values

    return in_row_chunks(readout, tokens, lm.max_chunk_rows)  # one chunk's [rows, n, V] at a time


class JaxBridge:
    """One engine session: the model loaded once, one LanguageModel (prompt cache) per (prompt, n)."""

    def __init__(self, config: dict, width: int):
        self.config, self.width = config, int(width)
        self.variant = dict(config.get("variant") or {})
        if config.get("platform"):
            jax.config.update("jax_platforms", str(config["platform"]))
        self.model = load_model(str(config["model"]))
        self.tokenizer = TemplateTokenizer(self.model.tokenizer)
        if self.width > self.model.config.vocab_size:
            raise EngineError(f"readout width {self.width} exceeds the vocabulary ({self.model.config.vocab_size})")
        self._models = {}
        self.eos = eos_policy(config, self.eos_ids)

    def language_model(self, prompt_ids, n):
        """The LanguageModel of this engine config for continuations of n tokens of `prompt_ids`."""
        key = (tuple(int(t) for t in prompt_ids), int(n))
        if key not in self._models:
            lm = language_model(self.model, list(key[0]), key[1], top_k=self.config.get("top_k"),
                                dtype=self.config.get("dtype", "float32"), eos_ids=self.eos.ids, eos=self.eos.mode)
            self._models[key] = lm.variant(**self.variant) if self.variant else lm
        return self._models[key]

    @property
    def eos_ids(self) -> list[int]:
        return sorted({int(e) for e in self.model.tokenizer.eos_ids})

    def _targets(self, tokens) -> jnp.ndarray:
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.shape[1] < 1:
            raise EngineError(f"trajectories must be [N, n] with n >= 1, got shape {tokens.shape}")
        if tokens.min() < 0 or tokens.max() >= self.model.config.vocab_size:
            raise EngineError(f"token ids outside [0, {self.model.config.vocab_size})")
        return jnp.asarray(tokens, jnp.int32)

    def sample(self, prompt_ids, num, n, seed) -> Sampled:
        lm = self.language_model(prompt_ids, n)
        tokens, logprobs, _, _ = _decode(lm, jax.random.key(int(seed)), jnp.zeros((int(num), int(n)), jnp.int32),
                                         self.width, False)
        return collect_sampled(np.asarray(tokens), np.asarray(logprobs), int(n), self.eos)

    def replay(self, prompt_ids, tokens, seed) -> Scored:
        """R passes give the same values: the seed is unused (exact logits; see the module doc)."""
        targets = self._targets(tokens)
        lm = self.language_model(prompt_ids, targets.shape[1])
        replayed, realized, ids, values = _decode(lm, jax.random.key(0), targets, self.width, True)
        check_replayed(np.asarray(replayed), np.asarray(targets), self.eos)
        return Scored(np.asarray(realized, np.float32), np.asarray(ids, np.int32), np.asarray(values, np.float32))

    def sequence_score(self, prompt_ids, tokens) -> Scored:
        """Second, non-default scorer: one teacher-forced pass per chunk of max_chunk_rows rows (the prefill path)."""
        targets = self._targets(tokens)
        lm = self.language_model(prompt_ids, targets.shape[1])
        realized, ids, values = (np.asarray(a) for a in _sequence(lm, targets, self.width))
        return Scored(realized.astype(np.float32), ids.astype(np.int32), values.astype(np.float32))

    def describe(self) -> dict:
        import flax
        import jaxlib

        return {"engine": "jax", "engine_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
                "flax_version": flax.__version__, "backend": jax.default_backend(),
                "devices": [str(d) for d in jax.devices()], "eos_ids": self.eos_ids, "eos": self.eos.mode}

    def close(self) -> None:
        self._models.clear()
        del self.model
