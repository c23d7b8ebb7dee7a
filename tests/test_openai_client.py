"""tvjax.engines.openai_bridge.Client against a scripted HTTP server on 127.0.0.1: retries on the
retryable statuses and on a refused connection, no retry on a client error, the request budget,
the bearer key, and kept-alive connections (one TCP connection for many requests)."""

import socket
import threading
from http.server import ThreadingHTTPServer

import pytest
from _http import JSONHandler

from tvjax.engines.openai_bridge import BudgetExceeded, Client
from tvjax.engines.protocol import EngineError


class Scripted(JSONHandler):
    """Answers each request with the next (status, body) of the server's script; records what it saw."""

    def _answer(self):
        body = self.read_json()
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization"), body, self.client_address))
        self.send_json(*(self.server.script.pop(0) if self.server.script else (200, {"ok": True})))

    do_GET = do_POST = _answer


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    srv.script, srv.seen = [], []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def client_of(srv, retries=3, budget=100, key=None):
    return Client(f"http://127.0.0.1:{srv.server_port}/v1/", key, requests_per_second=1000.0, max_retries=retries,
                  timeout_s=5, max_requests=budget)


def test_retryable_statuses_are_retried_then_answered(server, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda seconds: None)  # the backoff's waits
    server.script = [(429, {"error": "slow down"}), (503, {"error": "busy"}), (200, {"data": [{"id": "m"}]})]
    client = client_of(server, key="secret")
    assert client.request("/models") == {"data": [{"id": "m"}]}
    assert [(method, path, auth) for method, path, auth, _, _ in server.seen] == [("GET", "/v1/models", "Bearer secret")] * 3
    assert client.request("/completions", {"prompt": [1, 2]}) == {"ok": True}
    assert server.seen[-1][0] == "POST" and server.seen[-1][3] == {"prompt": [1, 2]}
    assert len({address for *_, address in server.seen}) == 1  # one kept-alive connection throughout
    client.close()


def test_client_errors_are_not_retried_and_retries_run_out(server, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    server.script = [(400, {"error": "bad prompt"})]
    client = client_of(server)
    with pytest.raises(EngineError, match=r"/completions: HTTP 400: .*bad prompt"):
        client.request("/completions", {"prompt": []})
    assert len(server.seen) == 1
    server.script = [(500, {"error": "down"})] * 3
    with pytest.raises(EngineError, match="HTTP 500"):
        client_of(server, retries=2).request("/models")
    assert len(server.seen) == 1 + 3


def test_a_refused_connection_fails_after_its_attempts(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}/v1", None, 1000.0, 2, 5, 10)
    with pytest.raises(EngineError, match="/models: .*after 3 attempts"):
        client.request("/models")


def test_the_budget_is_refused_up_front(server):
    client = client_of(server, budget=5)
    client.reserve(3)
    with pytest.raises(BudgetExceeded, match="3 more requests would exceed the budget of 5 .3 used."):
        client.reserve(3)
    client.reserve(2)
