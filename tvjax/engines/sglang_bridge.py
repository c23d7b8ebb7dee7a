"""SGLang bridge through its custom logit processor (GPU only: SGLang does not run on this CPU).

Engine config keys (configs/engine/sglang.yaml): model (a model folder), dtype, top_k,
mem_fraction_static, engine_args (extra sglang.Engine keyword arguments), seed, eos (suppress | stop).

The measurement flags of appendix B.1 are fixed: disable_cuda_graph=True, disable_radix_cache=True
(no prefix reuse across replay passes), enable_custom_logit_processor=True, all N requests of a
pass in one generate call.

All arithmetic lives in `process_batch`, a plain torch function tested on synthetic logits; the
SGLang glue only feeds it each row's custom params and step and ships the records back. SGLang runs
its scheduler in another process, so records travel through files: one JSON line per (request,
step) under a per-pass folder.

eos=suppress: ignore_eos and EOS banned, n steps per request. eos=stop: stop_token_ids = the EOS ids
(no_stop_trim, so the EOS stays in output_ids), nothing banned: a request, sampled or replayed,
finishes at its first EOS with a record of every step up to and including it; the missing steps
are placeholders that the worker replaces by the pad (`protocol.pad_scored`). (Untested here: no
CUDA; the arithmetic is `process_batch`, tested on synthetic logits.)
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from tvjax._extras import require
from tvjax.engines import replay
from tvjax.engines.protocol import EngineError, Sampled, Scored, check_replayed, collect_sampled, derive_seed, eos_policy
from tvjax.engines.readouts import score_trajectories
from tvjax.engines.tokens import eos_ids

torch = require("torch", "engines", "the torch-side engine bridges")


def process_batch(logits: torch.Tensor, params: list[dict | None], steps: list[int]
                  ) -> tuple[torch.Tensor, dict[int, replay.StepRecord]]:
    """One SGLang decode step for a batch: EOS suppression for every row with tvjax params, and for
    each row (replay or sample mode) a record of its renormalized top-k log-softmax taken before any
    forcing; replay rows are then forced to `params['targets'][step]`.

    params[i]: None (row untouched) or {"mode": "sample"|"replay", "k", "banned", "width",
    "targets" (replay)}; steps[i]: number of tokens the row's request has generated so far.
    Returns (logits, {row: record with [ ] / [width] tensors}); sample-mode records have realized = -inf
    (the token is not known yet: resolve it later with `replay.lookup`).
    """
    records = {}
    for i, p in enumerate(params):
        if not p:
            continue
        row = logits[i:i + 1]
        if p["mode"] == "replay":
            target = torch.tensor([p["targets"][steps[i]]], device=logits.device)
            record, forced = replay.replay_step(row, target, p["k"], p["banned"], p["width"])
            logits[i] = forced[0]
        elif p["mode"] == "sample":
            logprobs = replay.topk_logprobs(replay.suppress(row, p["banned"]), p["k"])
            ids, values = replay.readout(logprobs, p["width"])
            record = replay.StepRecord(torch.full((1,), replay.NEG_INF), ids, values)
            logits[i] = replay.suppress(row, p["banned"])[0]
        else:
            raise EngineError(f"unknown tvjax mode {p['mode']!r}")
        records[i] = replay.StepRecord(*(t[0].cpu() for t in record))
    return logits, records


def write_records(params: list[dict | None], steps: list[int], records: dict[int, replay.StepRecord]) -> None:
    """Append each row's record as one JSON line to params['record_file'] (runs in SGLang's scheduler)."""
    for i, rec in records.items():
        line = {"step": steps[i], "realized": float(rec.realized), "ids": rec.topk_ids.tolist(),
                "values": rec.topk_logprobs.tolist()}
        with open(params[i]["record_file"], "a") as f:
            f.write(json.dumps(line) + "\n")


def read_records(path: Path, n: int) -> replay.StepRecord:
    """A request's record file -> record with [n] / [n, width] tensors (n: the steps the request
    ran, its output length); refuses gaps and repeats."""
    lines = [json.loads(x) for x in Path(path).read_text().splitlines()]
    steps = [x["step"] for x in lines]
    if sorted(steps) != list(range(n)):
        raise EngineError(f"{path}: recorded steps {steps[:10]}... are not exactly 0..{n - 1}")
    lines.sort(key=lambda x: x["step"])
    return replay.StepRecord(torch.tensor([x["realized"] for x in lines]), torch.tensor([x["ids"] for x in lines]),
                             torch.tensor([x["values"] for x in lines]))


def processor_class():
    """The SGLang CustomLogitProcessor subclass (defined on demand: importing it needs SGLang)."""
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    class TvjaxReplayProcessor(CustomLogitProcessor):
        def __call__(self, logits, custom_param_list=None):
            params = list(custom_param_list or [])
            steps = [len(p["__req__"].output_ids) if p else 0 for p in params]
            logits, records = process_batch(logits, params, steps)
            write_records(params, steps, records)
            return logits

    return TvjaxReplayProcessor


class SGLangBridge:
    def __init__(self, config: dict, width: int):
        import sglang

        self.config, self.width, self.k = config, width, config.get("top_k")
        self.engine = sglang.Engine(model_path=str(config["model"]), dtype=config.get("dtype", "bfloat16"),
                                    random_seed=int(config["seed"]), disable_cuda_graph=True,
                                    disable_radix_cache=True, enable_custom_logit_processor=True,
                                    mem_fraction_static=float(config.get("mem_fraction_static", 0.5)),
                                    **dict(config.get("engine_args") or {}))
        self.tokenizer = self.engine.tokenizer_manager.tokenizer
        self.eos = eos_policy(config, eos_ids(self.tokenizer))
        self.processor = processor_class().to_str()

    def _run(self, prompt_ids, rows: list[dict], n: int, seed: int) -> tuple[list[list[int]], list[replay.StepRecord]]:
        folder = Path(tempfile.mkdtemp(prefix="tvjax-sglang-"))
        try:
            params = []
            stop = ({"ignore_eos": False, "stop_token_ids": list(self.eos.ids), "no_stop_trim": True}
                    if self.eos.stops else {"ignore_eos": True})
            for i, row in enumerate(rows):
                custom = dict(row, k=self.k, banned=self.eos.banned, width=self.width,
                              record_file=str(folder / f"{i}.jsonl"))
                params.append({"temperature": 1.0, "top_p": 1.0, "top_k": self.k or -1, "min_p": 0.0,
                               "max_new_tokens": n, "sampling_seed": derive_seed(seed, i),
                               "custom_params": custom, **stop})
            outs = self.engine.generate(input_ids=[list(prompt_ids)] * len(rows), sampling_params=params,
                                        custom_logit_processor=self.processor)
            tokens = [list(o["output_ids"]) for o in outs]
            return tokens, [read_records(folder / f"{i}.jsonl", len(t)) for i, t in enumerate(tokens)]
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def sample(self, prompt_ids, num, n, seed) -> Sampled:
        rows, records = self._run(prompt_ids, [{"mode": "sample"}] * num, n, seed)
        logprobs = [replay.lookup(r.topk_ids, r.topk_logprobs, torch.tensor(row, dtype=torch.long)).numpy()
                    for row, r in zip(rows, records)]
        return collect_sampled(rows, logprobs, n, self.eos)

    def replay(self, prompt_ids, tokens, seed) -> Scored:
        tokens = np.asarray(tokens)
        rows = [{"mode": "replay", "targets": row.tolist()} for row in tokens]
        replayed, records = self._run(prompt_ids, rows, tokens.shape[1], seed)
        check_replayed(replayed, tokens, self.eos)
        return replay.to_scored(replay.stack([replay.pad_steps(r, tokens.shape[1]) for r in records], 0))

    def sequence_score(self, prompt_ids, tokens) -> Scored:
        """Second, non-default scorer: SGLang's input log-probabilities (prefill path, the real
        positions under eos=stop), renormalized over the top-k of a readout of k + |banned| entries
        with the banned ids (EOS under eos=suppress) removed."""
        tokens = np.asarray(tokens)
        p, num_top = len(prompt_ids), (self.k or self.width) + len(self.eos.banned)
        rows = [row[:length] for row, length in zip(tokens, self.eos.lengths(tokens))]
        outs = self.engine.generate(input_ids=[list(prompt_ids) + row.tolist() for row in rows],
                                    sampling_params={"max_new_tokens": 1, "temperature": 1.0},
                                    return_logprob=True, logprob_start_len=p, top_logprobs_num=num_top)
        readouts = []
        for out, row in zip(outs, rows):
            tops = out["meta_info"]["input_top_logprobs"][:len(row)]
            own = out["meta_info"]["input_token_logprobs"][:len(row)]
            if [int(t) for _, t, _ in own] != row.tolist():
                raise EngineError("SGLang's input log-probabilities are not aligned with the trajectory")
            readouts.append([{**{int(t2): lp2 for lp2, t2, _ in top}, int(t): lp} for top, (lp, t, _) in zip(tops, own)])
        return score_trajectories(readouts, tokens, self.k, self.eos.banned, self.width)

    def describe(self) -> dict:
        import sglang

        return {"engine": "sglang", "engine_version": sglang.__version__, "torch_version": torch.__version__,
                "eos_ids": list(self.eos.ids), "eos": self.eos.mode, "disable_cuda_graph": True, "disable_radix_cache": True}

    def close(self) -> None:
        self.engine.shutdown()
