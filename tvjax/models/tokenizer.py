"""Tokenizers for the JAX models: a byte-level BPE `tokenizers.Tokenizer` built from GGUF metadata
(or a Hugging Face tokenizer.json), and the chat template rendered with jinja2.

Built the way transformers builds a GGUF tokenizer (integrations/gguf/gguf_tokenizer_mapping.py),
so a chat prompt encodes to the same ids.
"""

import hashlib
import json
from pathlib import Path
from typing import NamedTuple, Optional

import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

CONTROL, USER_DEFINED = 3, 4  # GGUF token types

# The text splits a GGUF `tokenizer.ggml.pre` names; others get GPT-2's (ByteLevel's own regex).
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS = {"qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
                        "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT}


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class ChatTokenizer(NamedTuple):
    """A tokenizer with its chat template and special tokens."""

    tokenizer: Tokenizer
    chat_template: Optional[str]
    special_tokens: dict  # bos_token, eos_token, ... -> string (what the template may reference)
    eos_ids: tuple  # token ids that end a generation (suppressed when sampling continuations)
    vocab_id: str  # sha256 of the vocabulary: two sides of a pair must agree

    def encode(self, text):
        """Token ids of `text`, special tokens matched whole, nothing added."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def render_chat(self, messages, add_generation_prompt=True):
        """The chat template applied to `messages` (a list of {"role", "content"} dicts)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template: pass the prompt as a string or as token ids")
        return render_chat_template(self.chat_template, messages, add_generation_prompt, self.special_tokens)

    def prompt_ids(self, prompt):
        """Token ids of a prompt given as a string, chat messages, or token ids."""
        if isinstance(prompt, str):
            return self.encode(prompt)
        prompt = list(prompt)
        if prompt and all(isinstance(m, dict) for m in prompt):
            return self.encode(self.render_chat(prompt))
        return [int(t) for t in prompt]


def render_chat_template(template, messages, add_generation_prompt=True, special_tokens=None):
    """Render a Hugging Face chat template as transformers does (sandboxed jinja2, trim_blocks,
    lstrip_blocks, loop controls, `raise_exception`, a `tojson` that keeps non-ASCII)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                            **(special_tokens or {}))


def vocabulary_id(tokens):
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


def tokenizer_from_gguf(metadata):
    """ChatTokenizer from GGUF metadata (field name -> value): byte-level BPE (`gpt2` model) only."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens = [str(t) for t in metadata["tokenizer.ggml.tokens"]]
    types = list(metadata.get("tokenizer.ggml.token_type") or [])
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # A token outside the byte alphabet is stored as text: spell its UTF-8 bytes in the alphabet.
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in metadata["tokenizer.ggml.merges"]]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                        fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(metadata.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, ...) match whole as special tokens; one spelled outside the
    # alphabet is a llama.cpp mislabel and is skipped, as transformers does.
    control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == USER_DEFINED])
    named = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
             "pad_token": "padding_token_id"}
    special = {name: tokens[int(metadata[f"tokenizer.ggml.{key}"])] for name, key in named.items()
               if f"tokenizer.ggml.{key}" in metadata}
    eos = tuple(sorted({int(metadata[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
                        if k in metadata}))
    return ChatTokenizer(tok, metadata.get("tokenizer.chat_template"), special, eos, vocabulary_id(tokens))


def tokenizer_from_folder(folder, declared_eos=None):
    """ChatTokenizer from a Hugging Face folder's tokenizer.json and tokenizer_config.json, or None
    without a tokenizer.json. `declared_eos`: the config's eos_token_id (int, list or None)."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        return None
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    special = {name: value if isinstance(value, str) else value.get("content")
               for name in ("bos_token", "eos_token", "unk_token", "pad_token")
               if isinstance(value := config.get(name), (str, dict))}
    eos = set([declared_eos] if isinstance(declared_eos, int) else list(declared_eos or []))
    if special.get("eos_token") is not None and tok.token_to_id(special["eos_token"]) is not None:
        eos.add(tok.token_to_id(special["eos_token"]))
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    return ChatTokenizer(tok, template, special, tuple(sorted(eos)), vocabulary_id(tokens))
