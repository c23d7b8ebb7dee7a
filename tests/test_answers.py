"""tvjax.engines.answers against a scripted chat server on 127.0.0.1: answers stored as they arrive,
a resumed run asks only for the missing ones (with the seeds a fresh run would use), manifests that
differ are refused, a torn last line is recovered and a damaged one refused, grey-box fields, and
the answers the audit cannot use."""

import threading
from http.server import ThreadingHTTPServer

import numpy as np
import pytest
from _http import JSONHandler

from tvjax.engines.answers import ANSWERS, AnswerStore, collect_answers
from tvjax.engines.protocol import EngineError

PROMPTS = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
PLAN = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]


class Chat(JSONHandler):
    def do_POST(self):
        body = self.read_json()
        srv = self.server
        with srv.lock:
            srv.seen.append(body)
            failing = srv.fail_after is not None and len(srv.seen) > srv.fail_after
        self.send_json(*((400, {"error": "no"}) if failing else (200, srv.reply(body))))


def completion(body, text=None, reason="length", logprobs=True):
    text = f"seed {body['seed']}" if text is None else text
    choice = {"message": {"content": text}, "finish_reason": reason}
    if body.get("logprobs") and logprobs:
        choice["logprobs"] = {"content": [{"token": "token_id:7", "logprob": -0.5,
                                           "top_logprobs": [{"token": "token_id:7", "logprob": -0.5}]}]}
    return {"choices": [choice]}


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    srv.seen, srv.lock, srv.fail_after, srv.reply = [], threading.Lock(), None, completion
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def config(srv):
    return {"base_url": f"http://127.0.0.1:{srv.server_address[1]}", "served_model": "m", "max_retries": 0,
            "requests_per_second": 1000, "max_concurrency": 2}


def test_a_killed_run_resumes_with_only_the_missing_requests(server, tmp_path):
    fresh = collect_answers(tmp_path / "fresh", config(server), PROMPTS, PLAN, 8, seed=3)
    server.seen.clear()
    server.fail_after = 2  # the third request fails for good: the run dies with two answers stored
    with pytest.raises(EngineError, match="HTTP 400"):
        collect_answers(tmp_path / "store", config(server), PROMPTS, PLAN, 8, seed=3)
    stored = AnswerStore.open(tmp_path / "store").answers()
    assert len(stored) == 2  # every answer that arrived is stored, by its worker
    server.seen.clear()
    server.fail_after = None
    seen = []
    resumed = collect_answers(tmp_path / "store", config(server), PROMPTS, PLAN, 8, seed=3,
                              progress=lambda done, total: seen.append((done, total)))
    assert len(server.seen) == len(PLAN) - len(stored)
    assert seen == [(done, len(PLAN)) for done in range(len(stored), len(PLAN) + 1)]
    assert resumed == fresh  # the same seeds per (prompt, call): the same answers, in plan order
    server.seen.clear()
    assert collect_answers(tmp_path / "store", config(server), PROMPTS, PLAN, 8, seed=3) == fresh
    assert server.seen == []


def test_a_store_for_other_questions_is_refused(server, tmp_path):
    collect_answers(tmp_path / "s", config(server), PROMPTS, PLAN[:2], 8, seed=3)
    with pytest.raises(ValueError, match="other questions: its request"):
        collect_answers(tmp_path / "s", {**config(server), "temperature": 0.7}, PROMPTS, PLAN[:2], 8, seed=3)
    with pytest.raises(ValueError, match="other questions: its prompts"):
        collect_answers(tmp_path / "s", config(server), PROMPTS[::-1], PLAN[:2], 8, seed=3)


def test_a_torn_last_line_is_dropped_and_a_damaged_one_refused(server, tmp_path):
    collect_answers(tmp_path / "s", config(server), PROMPTS, PLAN[:3], 8, seed=3)
    file = tmp_path / "s" / ANSWERS
    intact = file.read_bytes()
    file.write_bytes(intact + b'{"crc": 1, "answer": {"prom')
    with pytest.warns(UserWarning, match="torn last line"):
        assert len(AnswerStore.open(tmp_path / "s").answers()) == 3
    assert file.read_bytes() == intact
    lines = intact.decode().splitlines()
    file.write_text("\n".join([lines[0], lines[1].replace("seed", "deed"), lines[2]]) + "\n")
    with pytest.raises(ValueError, match=f"{ANSWERS}:2: a damaged answer line"):
        AnswerStore.open(tmp_path / "s").answers()


def test_grey_box_fields_and_an_endpoint_without_logprobs(server, tmp_path):
    answers = collect_answers(tmp_path / "g", config(server), PROMPTS, PLAN[:2], 8, seed=3, top_logprobs=1)
    assert server.seen[0]["logprobs"] is True and server.seen[0]["top_logprobs"] == 1
    assert answers[0].tokens == ["token_id:7"] and answers[0].logprobs == [-0.5]
    assert answers[0].top_logprobs == [{"token_id:7": -0.5}]
    server.reply = lambda body: completion(body, logprobs=False)
    with pytest.raises(EngineError, match="no log-probabilities"):
        collect_answers(tmp_path / "h", config(server), PROMPTS, PLAN[:1], 8, seed=3, top_logprobs=1)


def test_empty_answers_and_bad_plans(server, tmp_path):
    server.reply = lambda body: completion(body, text="", reason="stop")
    assert collect_answers(tmp_path / "a", config(server), PROMPTS, PLAN[:1], 8, seed=3)[0].text == ""  # EOS at once
    server.reply = lambda body: completion(body, text="", reason="length")
    with pytest.raises(EngineError, match="empty answer cut at max_tokens"):
        collect_answers(tmp_path / "b", config(server), PROMPTS, PLAN[:1], 8, seed=3)
    server.reply = lambda body: {"choices": []}
    with pytest.raises(EngineError, match="without choices"):
        collect_answers(tmp_path / "c", config(server), PROMPTS, PLAN[:1], 8, seed=3)
    assert collect_answers(tmp_path / "a", config(server), PROMPTS, [(np.int64(0), np.int32(0))], 8, seed=3)[0].text == ""
    for plan, message in (([(2, 0)], "prompt index must lie in"), ([(0, -1)], "call index be >= 0"),
                          ([(0, 0), (0, 0)], "repeats"), ([(0.5, 0)], "integers")):
        with pytest.raises(ValueError, match=message):
            collect_answers(tmp_path / "d", config(server), PROMPTS, plan, 8, seed=3)
    with pytest.raises(ValueError, match="list of"):
        collect_answers(tmp_path / "d", config(server), ["a string"], PLAN[:1], 8, seed=3)
