"""A text endpoint's answers, kept on disk as they arrive: a killed run resumes without asking again.

An answer store is a folder:

* manifest.json: what the answers answer (the endpoint's base_url and served model, the request
  fields, a digest of the prompts, the seed, the format version). Opening a store with another
  manifest is refused, so answers to other questions are never mixed in;
* answers.jsonl: one JSON line per answer, {"crc": crc32 of the payload's JSON, "answer": payload},
  appended, flushed and fsynced as each answer arrives. A torn last line (a run killed mid-write)
  is dropped with a warning; a damaged line before it is an error naming the file and line.

`collect_answers` asks only for the (prompt, call) pairs the store lacks, each with the seed
`derive_seed(seed, call_seed(prompt, call))`, so a resumed run sends exactly the requests a fresh
one would. With `top_logprobs`, it keeps the sampled tokens' log-probabilities (grey-box mode).
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import threading
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import NamedTuple

from tvjax.engines.openai_bridge import Client
from tvjax.engines.protocol import EngineError, derive_seed

FORMAT = 1
ANSWERS = "answers.jsonl"
MANIFEST = "manifest.json"


class Answer(NamedTuple):
    """One call's answer: its prompt index and call index within the prompt, the text and the
    finish_reason; in grey-box mode the sampled tokens as reported, their log-probs and the top-k
    log-probs of every position (None otherwise)."""

    prompt: int
    call: int
    text: str
    finish_reason: str
    tokens: list | None = None
    logprobs: list | None = None
    top_logprobs: list | None = None


def prompts_digest(prompts) -> str:
    return hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()


def _line(answer: Answer) -> str:
    payload = json.dumps(answer._asdict(), sort_keys=True)
    return json.dumps({"crc": zlib.crc32(payload.encode()), "answer": json.loads(payload)}, sort_keys=True)


def _parse(path: Path, number: int, line: str) -> Answer:
    record = json.loads(line)
    payload = json.dumps(record["answer"], sort_keys=True)
    if zlib.crc32(payload.encode()) != record["crc"]:
        raise ValueError(f"{path}:{number}: the answer's checksum does not match: the file is damaged")
    return Answer(**record["answer"])


class AnswerStore:
    """See the module doc. `open(path, manifest)`: create the folder or check its manifest;
    `open(path)`: read an existing store."""

    def __init__(self, path: Path, manifest: dict):
        self.path, self.manifest = path, manifest
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path, manifest: dict | None = None) -> "AnswerStore":
        path = Path(path)
        file = path / MANIFEST
        if file.is_file():
            stored = json.loads(file.read_text())
            if manifest is not None:
                wanted = json.loads(json.dumps({"format": FORMAT, **manifest}))  # as stored: tuples are lists
                for key in sorted(set(stored) | set(wanted)):
                    if stored.get(key) != wanted.get(key):
                        raise ValueError(f"{path} holds answers to other questions: its {key} is {stored.get(key)!r}, "
                                         f"this run's is {wanted.get(key)!r} (use another folder)")
            return cls(path, stored)
        if manifest is None:
            raise ValueError(f"{path} is not an answer store (no {MANIFEST})")
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps({"format": FORMAT, **manifest}, indent=2, sort_keys=True))
        tmp.replace(file)
        return cls(path, {"format": FORMAT, **manifest})

    def answers(self) -> dict:
        """{(prompt, call): Answer} of the stored lines; a torn last line is truncated away."""
        file = self.path / ANSWERS
        if not file.is_file():
            return {}
        data = file.read_bytes()
        complete, _, torn = data.rpartition(b"\n")
        if torn:  # no newline after the last line: its write did not finish
            warnings.warn(f"{file}: a torn last line (a run killed while writing it) is dropped", stacklevel=2)
            with file.open("r+b") as handle:
                handle.truncate(len(complete) + 1 if complete else 0)
        out = {}
        for number, raw in enumerate(complete.split(b"\n") if complete else [], 1):
            try:
                answer = _parse(file, number, raw.decode())
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{file}:{number}: a damaged answer line ({error}): the store cannot be trusted; "
                                 "move the file away to start again") from None
            out[(answer.prompt, answer.call)] = answer
        return out

    def append(self, answer: Answer) -> None:
        with self._lock, (self.path / ANSWERS).open("a") as handle:
            handle.write(_line(answer) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def call_seed(prompt: int, call: int) -> int:
    """The request index of (prompt, call) behind its seed: one number per pair, whatever the plan's order."""
    return derive_seed(prompt, call)


def check_prompts(prompts) -> list:
    if isinstance(prompts, (str, bytes)) or not prompts:
        raise ValueError("prompts must be a non-empty list of chat message lists")
    for index, messages in enumerate(prompts):
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ValueError(f"prompt {index} must be a list of {{'role': str, 'content': str}} messages, got {messages!r}")
    return list(prompts)


def check_plan(plan, num_prompts: int) -> list:
    checked = []
    for entry in plan:
        if (not isinstance(entry, (tuple, list)) or len(entry) != 2
                or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in entry)):
            raise ValueError(f"a plan entry must be (prompt index, call index) integers, got {entry!r}")
        prompt, call = int(entry[0]), int(entry[1])  # numpy integers too
        if not 0 <= prompt < num_prompts or call < 0:
            raise ValueError(f"plan entry {(prompt, call)}: the prompt index must lie in [0, {num_prompts}) "
                             "and the call index be >= 0")
        checked.append((prompt, call))
    if len(set(checked)) != len(checked):
        raise ValueError("the plan repeats a (prompt, call) pair")
    return checked


def parse_choice(response: dict, grey_box: bool, prompt: int, call: int) -> Answer:
    """The Answer of a chat completion response; clear EngineErrors for what the audit cannot use."""
    choices = response.get("choices") or []
    if not choices:
        raise EngineError(f"prompt {prompt}, call {call}: the endpoint answered without choices: {str(response)[:300]}")
    choice = choices[0]
    text = (choice.get("message") or {}).get("content")
    reason = str(choice.get("finish_reason"))
    if not isinstance(text, str):
        raise EngineError(f"prompt {prompt}, call {call}: a chat completion returned no text content (a tool call or a "
                          "refusal?)")
    if text == "" and reason == "length":
        raise EngineError(f"prompt {prompt}, call {call}: an empty answer cut at max_tokens: the endpoint produced no "
                          "visible text (hidden reasoning tokens? raise max_tokens or turn reasoning off)")
    if not grey_box:
        return Answer(prompt, call, text, reason)
    content = (choice.get("logprobs") or {}).get("content")
    if content is None:
        raise EngineError("the endpoint returned no log-probabilities (logprobs.content): the grey-box mode is not "
                          "available for it; use the text-only audit")
    try:
        return Answer(prompt, call, text, reason, [c["token"] for c in content], [float(c["logprob"]) for c in content],
                      [{t["token"]: float(t["logprob"]) for t in c.get("top_logprobs") or []} for c in content])
    except (KeyError, TypeError, ValueError) as error:
        raise EngineError(f"prompt {prompt}, call {call}: malformed logprobs.content ({error!r}): each entry needs "
                          "'token' and 'logprob'") from None


def collect_answers(store_path, config: dict, prompts, plan, max_tokens: int, seed: int, top_logprobs: int | None = None,
                    progress=None) -> list:
    """The answers of `plan` ((prompt index, call index) pairs) in plan order: stored ones reused,
    the missing ones requested concurrently (config max_concurrency) and each stored as soon as it
    arrives. `config`: base_url, served_model (None: ask /models), api_key_env, temperature,
    top_p, extra_body, max_requests, requests_per_second, max_retries, timeout_s, max_concurrency.
    progress(done, total) as answers arrive."""
    prompts = check_prompts(prompts)
    plan = check_plan(plan, len(prompts))
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    client = Client.from_config(config)
    try:
        served = config.get("served_model") or client.request("/models")["data"][0]["id"]
        fields = {"temperature": float(config.get("temperature", 1.0)), "top_p": float(config.get("top_p", 1.0)),
                  "max_tokens": int(max_tokens), **dict(config.get("extra_body") or {})}
        if top_logprobs is not None:
            fields.update(logprobs=True, top_logprobs=int(top_logprobs))
        manifest = {"base_url": config["base_url"], "served_model": served, "request": fields,
                    "prompts": prompts_digest(prompts), "seed": int(seed)}
        store = AnswerStore.open(store_path, manifest)
        have = store.answers()
        missing = [pair for pair in plan if pair not in have]
        if progress is not None:
            progress(len(plan) - len(missing), len(plan))
        if missing:
            client.reserve(len(missing))

            lock, done = threading.Lock(), [len(plan) - len(missing)]

            def ask(pair):
                """Request one answer and store it at once, from the worker: an answer that arrives is kept even
                when another request has failed or the main thread was interrupted meanwhile."""
                prompt, call = pair
                body = {"model": served, "messages": prompts[prompt], "seed": derive_seed(seed, call_seed(prompt, call)),
                        **fields}
                answer = parse_choice(client.request("/chat/completions", body), top_logprobs is not None, prompt, call)
                store.append(answer)
                with lock:
                    have[pair] = answer
                    done[0] += 1
                    if progress is not None:
                        progress(done[0], len(plan))

            with ThreadPoolExecutor(int(config.get("max_concurrency", 8))) as workers:
                futures = [workers.submit(ask, pair) for pair in missing]
                try:
                    for future in as_completed(futures):
                        future.result()  # the first failure stops the run
                except BaseException:
                    for future in futures:  # the queued requests are not sent; those in flight still store their answers
                        future.cancel()
                    raise
    finally:
        client.close()
    return [have[pair] for pair in plan]


def stored_texts(folder, side: str, config: dict, messages: list, num: int, max_tokens: int, seed: int) -> list:
    """`num` completions of `side`'s text-only chat endpoint for one prompt, kept in the answer
    store `folder`/`side` as they arrive: a rerun reuses them and asks only for the missing ones."""
    answers = collect_answers(Path(folder) / side, config, [list(messages)], [(0, i) for i in range(num)], max_tokens,
                              seed)
    return [a.text for a in answers]
