"""Real language models in JAX (Flax NNX): Llama (SmolLM2), Qwen2 and Qwen3 decoders loaded from
GGUF files, Hugging Face folders or random weights, and a language model as a tvjax process.

Modules:
  config:      ModelConfig: the shape of a model, from config.json or GGUF metadata
  transformer: the NNX modules (layers stacked and scanned) and `forward` on a split model
  weights:     loaders -> LoadedModel (graphdef, state, tokenizer); GGUF dequantizing; HF export
  tokenizer:   byte-level BPE from GGUF metadata, chat templates (jinja2)
  quantize:    int8 / int4 weight quantizers, GGUF block decoding, the int8 KV-cache format
  process:     LanguageModel: continuations of a prompt as a process; variants (Sampling,
               Serving: dtype, weight format, KV-cache dtype, attention chunking) share weights
"""

from tvjax._extras import require

# the packages the modules import at their top; gguf and safetensors are asked for where a file is read
for _package in ("flax", "tokenizers", "jinja2"):
    require(_package, "models", "language models in JAX")

from tvjax.models.config import ModelConfig
from tvjax.models.process import (
    LanguageModel,
    Sampling,
    Serving,
    after_eos,
    at_least_kth_largest,
    check_lm_pair,
    decode_loop,
    draw_token,
    language_model,
    prompt_processes,
    realized_logprobs,
    sampling_logits,
    sampling_logprobs,
    stopped_before,
    top_k,
)
from tvjax.models.quantize import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from tvjax.models.tokenizer import ChatTokenizer, render_chat_template, tokenizer_from_gguf
from tvjax.models.weights import LoadedModel, load_gguf, load_hf_folder, load_smollm2, random_model, save_hf_folder

__all__ = ["ModelConfig", "LanguageModel", "Sampling", "Serving", "check_lm_pair", "language_model", "prompt_processes",
           "sampling_logprobs", "sampling_logits", "realized_logprobs",
           "at_least_kth_largest", "top_k", "draw_token", "decode_loop", "after_eos", "stopped_before",
           "quantize_int8", "dequantize_int8", "quantize_int4", "dequantize_int4",
           "ChatTokenizer", "render_chat_template", "tokenizer_from_gguf", "LoadedModel", "load_gguf", "load_hf_folder",
           "load_smollm2", "random_model", "save_hf_folder"]
