"""Bridge to any OpenAI-compatible HTTP server: "is my provider serving what it claims?".

Engine config keys (configs/engine/openai.yaml): base_url, served_model, api_key_env, model (local
tokenizer source for the chat template and the EOS ids), top_k, top_logprobs, max_requests,
requests_per_second, max_retries, timeout_s, max_concurrency, seed, eos (suppress | stop).

What this access model measures (docs/howto/bridges.md has the full account):
* trajectories: /v1/completions with the chat-templated prompt as token ids, temperature 1, top_k
  (a non-standard field that vLLM and SGLang accept), EOS pushed out with logit_bias -100 (and
  ignore_eos for servers that know it), a per-request seed, and top log-probabilities of every
  sampled token (the sampling-time readout);
* replay draws: one request per prefix (token-id prompt = chat prompt + x_<t, max_tokens=1, top
  log-probabilities): the next-token top-K list at every prefix, renormalized over its top-k
  without EOS. This goes through the server's prefill path, not its decode path, and a server
  cannot be made to force tokens, so it is a per-prefix oracle, not the replay oracle of B.5;
* sequence scoring: one echo request per trajectory (prompt log-probabilities).
It needs token ids in the response (`return_tokens_as_token_ids`, a vLLM/SGLang extension): a
server that only returns token strings is refused rather than re-tokenized.

eos=stop: no logit_bias on EOS and no ignore_eos, so the server stops a completion at EOS as it
serves it; a completion shorter than n must have finish_reason "stop" on an EOS id (anything else,
a stop string say, is refused). Readouts keep EOS (its probability is part of the record); replay
sends per-prefix requests only for a trajectory's real positions (up to and including its EOS:
sum of lengths requests per pass, not N * n), and the worker pads the rest.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tvjax._extras import require
from tvjax.engines.models import load_tokenizer
from tvjax.engines.protocol import EngineError, Sampled, Scored, collect_sampled, derive_seed, eos_policy
from tvjax.engines.readouts import score_trajectories, score_trajectory
from tvjax.engines.tokens import eos_ids, generation_config_eos

httpx = require("httpx", "endpoints", "OpenAI-compatible endpoints")

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class BudgetExceeded(EngineError):
    """A pass would need more requests than the session's remaining budget."""


class Client:
    """JSON POST/GET over one httpx connection pool (kept-alive connections: on loopback 0.55 ms a
    request against urllib's 1.8 ms, which opens a connection per request, and over TLS a handshake
    per request), with what neither httpx nor the openai SDK has: retries with exponential backoff
    on connection errors and 408/409/429/5xx under a requests-per-second limit shared by all
    threads, and a request budget."""

    def __init__(self, base_url: str, api_key: str | None, requests_per_second: float, max_retries: int,
                 timeout_s: float, max_requests: int):
        self.base_url = base_url.rstrip("/")
        self.interval = 1.0 / float(requests_per_second)
        self.max_retries, self.max_requests = int(max_retries), int(max_requests)
        self.used = 0
        self._lock = threading.Lock()
        self._next_start = time.monotonic()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=float(timeout_s))

    @classmethod
    def from_config(cls, config: dict) -> "Client":
        """The client of an engine config (base_url, api_key_env, requests_per_second, max_retries,
        timeout_s, max_requests)."""
        return cls(config["base_url"], os.environ.get(config.get("api_key_env") or "", None),
                   config.get("requests_per_second", 20.0), config.get("max_retries", 5), config.get("timeout_s", 60),
                   config.get("max_requests", 100000))

    def reserve(self, count: int) -> None:
        """Refuse up front a batch of `count` requests that would exceed the budget."""
        with self._lock:
            if self.used + count > self.max_requests:
                raise BudgetExceeded(f"{count} more requests would exceed the budget of {self.max_requests} "
                                     f"({self.used} used); raise max_requests or shrink the campaign")
            self.used += count

    def _wait_turn(self) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_start)
            self._next_start = start + self.interval
        time.sleep(max(0.0, start - now))

    def request(self, path: str, payload: dict | None = None) -> dict:
        for attempt in range(self.max_retries + 1):
            self._wait_turn()
            try:
                if payload is None:
                    response = self.http.get(self.base_url + path)
                else:
                    response = self.http.post(self.base_url + path, json=payload)
            except httpx.TransportError as e:  # refused, reset, timed out
                if attempt == self.max_retries:
                    raise EngineError(f"{path}: {e!r} after {attempt + 1} attempts") from e
            else:
                if response.is_success:
                    return response.json()
                if response.status_code not in RETRY_STATUS or attempt == self.max_retries:
                    raise EngineError(f"{path}: HTTP {response.status_code}: {response.text[:1000]}")
            time.sleep(min(30.0, 0.5 * 2 ** attempt))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.http.close()


def token_id(key: str) -> int:
    """'token_id:123' -> 123; anything else means the server did not return token ids."""
    if not key.startswith("token_id:"):
        raise EngineError(f"the server returned token {key!r}, not a token id: it must support "
                          "return_tokens_as_token_ids (vLLM, SGLang) for token-exact measurements")
    return int(key[len("token_id:"):])


def readouts_of(logprobs: dict) -> tuple[list[int], list[float], list[dict[int, float]]]:
    """(token ids, their log-probs, per-position top-K readouts) of a completions `logprobs` object."""
    ids = [token_id(t) for t in logprobs["tokens"]]
    tops = [{} if top is None else {token_id(t): float(lp) for t, lp in top.items()} for top in logprobs["top_logprobs"]]
    own = [float("-inf") if lp is None else float(lp) for lp in logprobs["token_logprobs"]]
    for top, i, lp in zip(tops, ids, own):
        top.setdefault(i, lp)
    return ids, own, tops


class OpenAIBridge:
    def __init__(self, config: dict, width: int):
        self.config, self.width, self.k = config, width, config.get("top_k")
        if self.k is None:
            raise ValueError("the OpenAI bridge needs a finite top_k (its readouts are top-K lists)")
        self.tokenizer = load_tokenizer(config["model"])
        self.eos = eos_policy(config, eos_ids(self.tokenizer, generation_config_eos(config["model"])))
        self.num_top = int(config.get("top_logprobs") or (self.k + len(self.eos.banned)))
        self.client = Client.from_config(config)
        self.served = config.get("served_model") or self.client.request("/models")["data"][0]["id"]
        self.pool = ThreadPoolExecutor(int(config.get("max_concurrency", 8)))

    def _body(self, prompt: list[int], max_tokens: int, seed: int, **extra) -> dict:
        banned = {} if self.eos.stops else {"logit_bias": {str(b): -100 for b in self.eos.banned}, "ignore_eos": True}
        return {"model": self.served, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0,
                "top_p": 1.0, "top_k": self.k, "seed": seed, "logprobs": self.num_top,
                "return_tokens_as_token_ids": True, **banned, **extra}

    def _complete(self, bodies: list[dict]) -> list[dict]:
        self.client.reserve(len(bodies))
        return list(self.pool.map(lambda b: self.client.request("/completions", b)["choices"][0], bodies))

    def _score(self, readouts: list[list[dict[int, float]]], tokens) -> Scored:
        return score_trajectories(readouts, tokens, self.k, self.eos.banned, self.width)

    def sample(self, prompt_ids, num, n, seed) -> Sampled:
        choices = self._complete([self._body(prompt_ids, n, derive_seed(seed, i)) for i in range(num)])
        rows, logprobs = [], []
        for choice in choices:
            ids, _own, tops = readouts_of(choice["logprobs"])
            if self.eos.stops and choice.get("finish_reason") == "stop" and (not ids or ids[-1] not in self.eos.ids):
                raise EngineError(f"a completion finished with reason 'stop' on {ids[-1:]}, not on an EOS id "
                                  f"{list(self.eos.ids)} (a stop string?)")
            rows.append(ids)
            logprobs.append(score_trajectory(tops, ids, self.k, self.eos.banned, self.width).logprobs)
        return collect_sampled(rows, logprobs, n, self.eos)

    def replay(self, prompt_ids, tokens, seed) -> Scored:
        """Per-prefix readouts: one request with max_tokens=1 per real position (N * n under
        eos=suppress; see module doc)."""
        tokens = np.asarray(tokens)
        lengths = self.eos.lengths(tokens)
        bodies = [self._body(list(prompt_ids) + tokens[i, :t].tolist(), 1, derive_seed(seed, i, t))
                  for i, length in enumerate(lengths) for t in range(length)]
        tops = [readouts_of(c["logprobs"])[2][0] for c in self._complete(bodies)]
        starts = np.concatenate([[0], np.cumsum(lengths)])
        return self._score([tops[a:b] for a, b in zip(starts[:-1], starts[1:])], tokens)

    def sequence_score(self, prompt_ids, tokens) -> Scored:
        """Second, non-default scorer: one echo request per trajectory (prompt log-probabilities),
        of its real positions under eos=stop."""
        tokens = np.asarray(tokens)
        p = len(prompt_ids)
        rows = [row[:length].tolist() for row, length in zip(tokens, self.eos.lengths(tokens))]
        bodies = [self._body(list(prompt_ids) + row, 1, 0, echo=True) for row in rows]
        readouts = []
        for choice, row in zip(self._complete(bodies), rows):
            ids, _own, tops = readouts_of(choice["logprobs"])
            if ids[p:p + len(row)] != row:
                raise EngineError("the echoed prompt is not the trajectory: the server re-tokenized it")
            readouts.append(tops[p:p + len(row)])
        return self._score(readouts, tokens)

    def describe(self) -> dict:
        return {"engine": "openai-compatible", "base_url": self.config["base_url"], "served_model": self.served,
                "eos_ids": list(self.eos.ids), "eos": self.eos.mode, "top_logprobs": self.num_top}

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()
