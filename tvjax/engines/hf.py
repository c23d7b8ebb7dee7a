"""transformers bridge: sampling and replay scoring through `model.generate` (KV-cached decode path).

Engine config keys (configs/engine/transformers.yaml):
  model: 'smollm2' | path to a model folder or .gguf file
  dtype: float32 | bfloat16 | float16
  attn_implementation: eager | sdpa
  sdpa_backend: null | math | flash | efficient | cudnn   (pins torch's SDPA kernel; sdpa only)
  top_k: int | null       (engine-applied truncation; null = none)
  device: cpu | cuda ...
  threads: torch intra-op threads (null = torch's default)
  eos: suppress | stop    (tvjax.engines.protocol.Eos)

Replay: a `LogitsProcessor` sees each step's scores after EOS suppression and before the top-k
warper (transformers runs custom processors before warpers), records the renormalized top-k
log-softmax, and forces the trajectory's token; `generate` then decodes along the trajectory.

eos=suppress: `min_new_tokens=n` and `suppress_tokens` keep EOS out, every row has n tokens.
eos=stop: `generate` gets the EOS ids as `eos_token_id` (pad_token_id = the smallest), nothing
banned: a row finishes at its first EOS (the EOS step's scores are recorded; generate pads the
row after it), and generate ends early once every row has finished. Sampling pads its output to n
(`collect_sampled`); replay forces the pool's trajectories (their pad after EOS is generate's own),
so a forced EOS finishes its row, and records of the steps generate did not run are placeholders
that the worker replaces by the pad (`protocol.pad_scored`), as it does the steps after EOS.
"""

from __future__ import annotations

import contextlib

import numpy as np

from tvjax._extras import require
from tvjax.engines import replay
from tvjax.engines.models import load_tokenizer, resolve
from tvjax.engines.protocol import EngineError, Sampled, Scored, check_replayed, collect_sampled, eos_policy
from tvjax.engines.tokens import eos_ids

torch = require("torch", "engines", "the torch-side engine bridges")

SDPA_BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "cudnn": "CUDNN_ATTENTION"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ReplayProcessor:
    """A transformers logits processor: records the step's renormalized top-k log-softmax and, when
    given targets, forces them. Records are kept on the CPU, one StepRecord per step."""

    def __init__(self, prompt_len: int, k: int | None, banned: list[int], width: int, targets=None):
        self.prompt_len, self.k, self.banned, self.width = prompt_len, k, banned, width
        self.targets = targets
        self.records: list[replay.StepRecord] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_len
        if self.targets is None:
            return replay.suppress(scores, self.banned)
        if step > 0 and not torch.equal(input_ids[:, -1].cpu(), self.targets[:, step - 1]):
            raise EngineError(f"replay diverged from the trajectory at step {step - 1}")
        record, forced = replay.replay_step(scores, self.targets[:, step].to(scores.device), self.k,
                                            self.banned, self.width)
        self.records.append(replay.StepRecord(*(t.cpu() for t in record)))
        return forced


class TransformersBridge:
    def __init__(self, config: dict, width: int):
        from transformers import AutoModelForCausalLM

        self.config, self.width = config, width
        self.k = config.get("top_k")
        self.device = torch.device(config.get("device", "cpu"))
        if config.get("threads"):
            torch.set_num_threads(int(config["threads"]))
        dtype = config.get("dtype", "float32")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        folder, gguf = resolve(config["model"])
        self.tokenizer = load_tokenizer(config["model"])
        self.model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=gguf, dtype=DTYPES[dtype],
            attn_implementation=config.get("attn_implementation", "sdpa")).to(self.device).eval()
        self.eos = eos_policy(config, eos_ids(self.tokenizer, self.model.generation_config.eos_token_id))

    def _attention(self):
        backend = self.config.get("sdpa_backend")
        if backend is None:
            return contextlib.nullcontext()
        if self.config.get("attn_implementation", "sdpa") != "sdpa":
            raise ValueError("sdpa_backend needs attn_implementation: sdpa")
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend]))

    def _generate(self, prompt_ids, num, n, seed, processor):
        from transformers import GenerationConfig, LogitsProcessorList

        eos = self.eos
        fixed = {} if eos.stops else {"min_new_tokens": n, "suppress_tokens": eos.banned}
        gen = GenerationConfig(do_sample=True, temperature=1.0, top_k=self.k or 0, top_p=1.0,
                               max_new_tokens=n, eos_token_id=list(eos.ids), pad_token_id=eos.pad,
                               output_scores=True, return_dict_in_generate=True, **fixed)
        input_ids = torch.tensor([prompt_ids] * num, device=self.device)
        torch.manual_seed(seed)
        with torch.inference_mode(), self._attention():
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                      generation_config=gen, logits_processor=LogitsProcessorList([processor]))
        tokens = out.sequences[:, len(prompt_ids):].cpu()
        # under eos=stop generate ends early once every row has finished
        if tokens.shape[0] != num or not (tokens.shape[1] == n or (self.eos.stops and 1 <= tokens.shape[1] < n)):
            raise EngineError(f"generate returned {tuple(tokens.shape)} tokens, expected {(num, n)}")
        return tokens, out.scores

    def sample(self, prompt_ids, num, n, seed) -> Sampled:
        processor = ReplayProcessor(len(prompt_ids), self.k, self.eos.banned, self.width)
        tokens, scores = self._generate(prompt_ids, num, n, seed, processor)
        logprobs = torch.stack([replay.realized(torch.log_softmax(s.float().cpu(), -1), tokens[:, t])
                                for t, s in enumerate(scores)], 1)
        return collect_sampled(tokens.numpy(), logprobs.numpy(), n, self.eos)

    def replay(self, prompt_ids, tokens, seed) -> Scored:
        targets = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        processor = ReplayProcessor(len(prompt_ids), self.k, self.eos.banned, self.width, targets)
        replayed, _ = self._generate(prompt_ids, targets.shape[0], targets.shape[1], seed, processor)
        check_replayed(replayed.numpy(), targets.numpy(), self.eos)
        return replay.to_scored(replay.pad_steps(replay.stack(processor.records, 1), targets.shape[1], axis=1))

    def sequence_score(self, prompt_ids, tokens, chunk: int = 8) -> Scored:
        """Second, non-default scorer: one full-sequence forward pass (the prefill path); under
        eos=stop the pad after a row's EOS is fed too (causal attention: it changes no earlier
        position) and its positions are replaced by the worker."""
        tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        p = len(prompt_ids)
        parts = []
        for rows in torch.split(tokens, chunk):
            ids = torch.cat([torch.tensor([prompt_ids] * rows.shape[0]), rows], 1).to(self.device)
            with torch.inference_mode(), self._attention():
                logits = self.model(ids).logits[:, p - 1:-1].float().cpu()
            logprobs = replay.topk_logprobs(replay.suppress(logits.flatten(0, 1), self.eos.banned), self.k)
            ids_w, vals_w = replay.readout(logprobs, self.width)
            record = replay.StepRecord(replay.realized(logprobs, rows.flatten()), ids_w, vals_w)
            parts.append([t.reshape(*rows.shape, *t.shape[1:]) for t in record])
        return replay.to_scored(replay.StepRecord(*(torch.cat(c) for c in zip(*parts))))

    def describe(self) -> dict:
        import transformers

        return {"engine": "transformers", "engine_version": transformers.__version__,
                "torch_version": torch.__version__, "eos_ids": list(self.eos.ids), "eos": self.eos.mode}

    def close(self) -> None:
        del self.model
