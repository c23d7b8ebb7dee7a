"""A tiny randomly initialized Llama with a word-level tokenizer and a chat template, built in code.

For tests and smoke runs of every bridge without a download:

    python -m tvjax.engines.tiny_model OUT_DIR [--seed 0] [--eos-scale 1.0]

`--eos-scale` multiplies the EOS token's row of the output layer, widening the spread of its logit:
above 1 the EOS token is often the most likely one, so outputs that stop at EOS (eos=stop) end at
varied lengths within a few tokens.

(needs torch, transformers and tokenizers: run it with .venv-transformers/bin/python).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
WORDS = ["system", "user", "assistant", "You", "are", "a", "helpful", "assistant.", "Tell", "me", "story",
         "about", "robot", "learning", "to", "paint."]
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|> {{ message['role'] }} {{ message['content'] }} "
                 "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = SPECIALS + WORDS
    names += [f"w{i}" for i in range(vocab_size - len(names))]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|im_end|>", chat_template=CHAT_TEMPLATE)


def build(out: str | os.PathLike, seed: int = 0, vocab_size: int = 256, eos_scale: float = 1.0) -> Path:
    """Write the tiny model folder (config, safetensors weights, tokenizer) and return it;
    `eos_scale` multiplies the EOS row of the output layer (see module doc)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    tokenizer = build_tokenizer(vocab_size)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                         initializer_range=0.3, tie_word_embeddings=False, bos_token_id=1, eos_token_id=eos,
                         pad_token_id=eos, dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[eos] *= float(eos_scale)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eos-scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    print(build(args.out, args.seed, eos_scale=args.eos_scale))


if __name__ == "__main__":
    main()
