"""vLLM bridge through the V1 logits-processor interface (vllm.v1.sample.logits_processor).

Engine config keys (configs/engine/vllm.yaml):
  model: 'smollm2' (converted once to safetensors, see tvjax.engines.models) | model folder
  dtype: float32 | bfloat16 | float16
  top_k: int | null
  kv_cache_gb: CPU KV-cache size (VLLM_CPU_KVCACHE_SPACE; ignored on GPUs)
  max_model_len: null (= prompt + n, rounded up)
  engine_args: extra keyword arguments for vllm.LLM (e.g. gpu_memory_utilization)
  eos: suppress | stop (tvjax.engines.protocol.Eos)

The measurement flags of appendix B.1 are fixed: enforce_eager=True, enable_prefix_caching=False,
all N requests of a pass in one batch (max_num_seqs >= N). The engine core runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the logits processor's records are visible here; the V1
model runner is selected (VLLM_USE_V2_MODEL_RUNNER=0) because the processor uses its interface.
Both are set when a bridge opens its engine (vLLM reads them then, not at import); importing this
module imports no vLLM (whose import sets environment variables) and changes no process state.

The logits processor acts on requests whose SamplingParams.extra_args carry a "tvjax" entry:
mode "sample" suppresses the entry's banned ids (EOS under eos=suppress, none under eos=stop);
mode "replay" also records the renormalized top-k log-softmax of the
step (before forcing) and forces the trajectory's token. vLLM applies custom (non-argmax-invariant)
processors to the float32 logits before temperature and top-k, so the record sees exactly the
logits the sampler truncates. Its logic is `ReplayRows`; `processor_class` makes it a vLLM
LogitsProcessor class whose instances (created by the engine) record into the sink of the one
bridge session that made the class.

eos=suppress: ignore_eos=True and EOS banned, every request runs n steps. eos=stop: ignore_eos=False
and stop_token_ids = the EOS ids, nothing banned: a request finishes at its first EOS, in sampling
and in replay alike (forcing the EOS token finishes the replayed request, as it finished the sampled
one, so the batch shrinks as it did at sampling time); the processor has recorded every step up to
and including the EOS step, the missing steps are placeholders that the worker replaces by the pad
(`protocol.pad_scored`).
"""

from __future__ import annotations

import os

import numpy as np

from tvjax._extras import require
from tvjax.engines import replay
from tvjax.engines.models import converted_dir
from tvjax.engines.protocol import EngineError, Sampled, Scored, check_replayed, collect_sampled, derive_seed, eos_policy
from tvjax.engines.readouts import score_trajectories
from tvjax.engines.tokens import eos_ids

torch = require("torch", "engines", "the torch-side engine bridges")

Records = dict[str, list[replay.StepRecord]]  # request key -> per-step records of a replayed request


class _Request:
    def __init__(self, opts: dict, output_tok_ids: list[int]):
        self.opts, self.output = opts, output_tok_ids


class ReplayRows:
    """Batch-level logic of the vLLM V1 logits processor: EOS suppression, recording and forcing
    (see module doc). `records` is the sink of one bridge session, set by `processor_class`."""

    records: Records

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.requests: dict[int, _Request] = {}

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        opts = (sampling_params.extra_args or {}).get("tvjax")
        if opts is not None and opts.get("mode") not in ("sample", "replay"):
            raise ValueError(f"extra_args['tvjax']['mode'] must be 'sample' or 'replay', got {opts!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        """Follow vLLM's BatchUpdate (removed, then added, then moved rows of the persistent batch)."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.requests.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            opts = (params.extra_args or {}).get("tvjax")
            self.requests.pop(index, None)
            if opts is not None:
                self.requests[index] = _Request(opts, output)
                if opts["mode"] == "replay":
                    self.records[opts["key"]] = []
        for a, b, direction in batch_update.moved:
            entry_a, entry_b = self.requests.pop(a, None), self.requests.pop(b, None)
            if entry_a is not None:
                self.requests[b] = entry_a
            if entry_b is not None and direction.name == "SWAP":
                self.requests[a] = entry_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.requests:
            return logits
        rows = sorted(self.requests)
        opts = self.requests[rows[0]].opts
        if any(self.requests[r].opts["banned"] != opts["banned"] for r in rows):
            raise EngineError("requests of one batch must share their EOS ids")
        index = torch.tensor(rows, device=logits.device)
        logits[index] = replay.suppress(logits[index], opts["banned"])
        replaying = [r for r in rows if self.requests[r].opts["mode"] == "replay"]
        if replaying:
            self._replay_rows(logits, replaying)
        return logits

    def _replay_rows(self, logits: torch.Tensor, rows: list[int]) -> None:
        reqs = [self.requests[r] for r in rows]
        opts = reqs[0].opts
        if any((q.opts["k"], q.opts["width"]) != (opts["k"], opts["width"]) for q in reqs):
            raise EngineError("replayed requests of one batch must share top_k and readout width")
        targets = []
        for q in reqs:
            step = len(q.output)
            if step and q.output[-1] != q.opts["targets"][step - 1]:
                raise EngineError(f"request {q.opts['key']}: replay diverged at step {step - 1}")
            targets.append(q.opts["targets"][step])
        index = torch.tensor(rows, device=logits.device)
        record, forced = replay.replay_step(logits[index], torch.tensor(targets, device=logits.device),
                                            opts["k"], opts["banned"], opts["width"])
        logits[index] = forced
        for i, q in enumerate(reqs):
            self.records[q.opts["key"]].append(replay.StepRecord(*(t[i].cpu() for t in record)))


def processor_class(sink: Records) -> type:
    """A vLLM LogitsProcessor class running `ReplayRows` into `sink` (made on demand: it subclasses
    vLLM's interface, and importing vLLM sets environment variables)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class TvjaxReplayProcessor(ReplayRows, LogitsProcessor):
        records = sink

    return TvjaxReplayProcessor


def engine_environment(config: dict, environ) -> dict[str, str]:
    """The environment variables vLLM must read when the bridge opens its engine (see module doc);
    an explicit VLLM_USE_V2_MODEL_RUNNER in `environ` is kept."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_USE_V2_MODEL_RUNNER": environ.get("VLLM_USE_V2_MODEL_RUNNER", "0")}
    if config.get("kv_cache_gb"):
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(config["kv_cache_gb"]))
    return env


class VLLMBridge:
    def __init__(self, config: dict, width: int):
        os.environ.update(engine_environment(config, os.environ))
        from vllm import LLM

        self.config, self.width, self.k = config, width, config.get("top_k")
        self.records: Records = {}
        optional = {key: int(config[key]) for key in ("max_model_len", "max_num_seqs") if config.get(key)}
        self.llm = LLM(model=str(converted_dir(config["model"])), dtype=config.get("dtype", "float32"),
                       enforce_eager=True, enable_prefix_caching=False, seed=int(config["seed"]),
                       logits_processors=[processor_class(self.records)], logprobs_mode="processed_logprobs",
                       **optional, **dict(config.get("engine_args") or {}))
        self.tokenizer = self.llm.get_tokenizer()
        self.eos = eos_policy(config, eos_ids(self.tokenizer, self.llm.llm_engine.model_config.hf_config.eos_token_id))

    def _params(self, n: int, seed: int, row: int, opts: dict, logprobs: int | None):
        from vllm import SamplingParams

        stop = {"ignore_eos": False, "stop_token_ids": list(self.eos.ids)} if self.eos.stops else {"ignore_eos": True}
        return SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=self.k or 0, min_p=0.0, max_tokens=n,
                              seed=derive_seed(seed, row), logprobs=logprobs,
                              extra_args={"tvjax": dict(opts, banned=self.eos.banned)}, **stop)

    def _generate(self, prompt_ids, params):
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(prompt_ids)) for _ in params]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [o.outputs[0] for o in outputs]

    def sample(self, prompt_ids, num, n, seed) -> Sampled:
        params = [self._params(n, seed, i, {"mode": "sample"}, logprobs=0) for i in range(num)]
        outs = self._generate(prompt_ids, params)
        logprobs = [[step[int(t)].logprob for step, t in zip(o.logprobs, o.token_ids)] for o in outs]
        return collect_sampled([list(o.token_ids) for o in outs], logprobs, n, self.eos)

    def replay(self, prompt_ids, tokens, seed) -> Scored:
        tokens = np.asarray(tokens)
        keys = [f"{seed}-{i}" for i in range(tokens.shape[0])]
        params = [self._params(tokens.shape[1], seed, i, {"mode": "replay", "key": key, "k": self.k,
                                                          "width": self.width, "targets": row.tolist()}, None)
                  for i, (key, row) in enumerate(zip(keys, tokens))]
        outs = self._generate(prompt_ids, params)
        check_replayed([list(o.token_ids) for o in outs], tokens, self.eos)
        records = [self.records.pop(key) for key in keys]
        short = [i for i, (r, length) in enumerate(zip(records, self.eos.lengths(tokens))) if len(r) < length]
        if short:
            raise EngineError(f"replayed requests {short[:5]} recorded fewer steps than their trajectories")
        n = tokens.shape[1]
        return replay.to_scored(replay.stack([replay.pad_steps(replay.stack(r, 0), n) for r in records], 0))

    def sequence_score(self, prompt_ids, tokens) -> Scored:
        """Second, non-default scorer: vLLM's prompt log-probabilities (one prefill per trajectory, up
        to its length under eos=stop), renormalized over the top-k of a readout of k + |banned|
        entries with the banned ids (EOS under eos=suppress) removed."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        tokens = np.asarray(tokens)
        p, banned = len(prompt_ids), self.eos.banned
        num_top = (self.k or self.width) + len(banned)
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=num_top)
        prompts = [TokensPrompt(prompt_token_ids=list(prompt_ids) + row[:length].tolist())
                   for row, length in zip(tokens, self.eos.lengths(tokens))]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        readouts = [[{t: lp.logprob for t, lp in step.items()} for step in o.prompt_logprobs[p:]] for o in outs]
        return score_trajectories(readouts, tokens, self.k, banned, self.width)

    def describe(self) -> dict:
        import vllm

        return {"engine": "vllm", "engine_version": vllm.__version__, "torch_version": torch.__version__,
                "eos_ids": list(self.eos.ids), "eos": self.eos.mode, "enforce_eager": True, "enable_prefix_caching": False}

    def close(self) -> None:
        del self.llm
