"""Tokenizer facts every bridge needs: the chat-templated prompt and the EOS ids (suppressed under
eos=suppress, where rows stop under eos=stop; see tvjax.engines.protocol.Eos).

Imports neither torch nor JAX. transformers is imported only when a tokenizer is loaded
(`tvjax.engines.models.load_tokenizer`), because
importing it pulls in torch wherever torch is installed; its tokenizer classes themselves work
without torch, so the HTTP bridge needs no torch.
"""

from __future__ import annotations

import json

from tvjax.engines.models import load_tokenizer, resolve
from tvjax.engines.protocol import EngineError


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat-templated prompt (with the assistant's generation prompt) as token ids."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return [int(i) for i in ids]


def eos_ids(tokenizer, declared=None) -> list[int]:
    """Every end-of-sequence id of a model, sorted: the tokenizer's plus `declared`, the
    eos_token_id a model config declares (an int, a list of ints or None)."""
    ids = [] if declared is None else ([declared] if isinstance(declared, int) else list(declared))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise EngineError("the model declares no EOS token: eos=suppress needs one to suppress, eos=stop one to stop at")
    return sorted({int(i) for i in ids})


def generation_config_eos(model: str):
    """The eos_token_id that a model folder's generation_config.json declares; None without one
    (GGUF files carry theirs in the tokenizer)."""
    folder, gguf = resolve(model)
    path = folder / "generation_config.json"
    if gguf is not None or not path.is_file():
        return None
    return json.loads(path.read_text()).get("eos_token_id")


def model_eos_ids(model: str) -> list[int]:
    """A model's EOS ids from its tokenizer and generation_config.json, without loading weights
    (what the OpenAI bridge uses; `python -m tvjax.engines.worker --describe-eos` prints it so that
    a campaign can create a stopping pool before any engine opens)."""
    return eos_ids(load_tokenizer(model), generation_config_eos(model))
