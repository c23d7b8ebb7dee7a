"""The docs site: `mkdocs build --strict` succeeds, every API name is rendered, and every built page
opens in headless Chromium without a console error.

Console errors are collected over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages separated by NUL bytes on file descriptors 3 and 4), so nothing beyond the standard
library is needed: `Runtime.consoleAPICalled` (console.error and console.assert),
`Runtime.exceptionThrown` (uncaught exceptions) and `Log.entryAdded` at level error (failed loads of
scripts, styles and fonts, blocked requests). One browser opens the pages, a few tabs at a time.
The site is served by `http.server` on 127.0.0.1, as a reader's browser would load it.
"""

import fcntl
import functools
import http.server
import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tvjax

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TABS = 4  # pages open at once in the one browser
PAGE_TIMEOUT = 30.0  # seconds for one page to fire its load event
QUIET = 0.5  # seconds without a new event after the load event before a page counts as done


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """(returncode, output, site folder) of `mkdocs build --strict` into a fresh folder."""
    site = tmp_path_factory.mktemp("docs") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    return done.returncode, done.stdout + done.stderr, site


@pytest.fixture(scope="module")
def site(build):
    returncode, output, folder = build
    if returncode != 0:
        pytest.fail(f"mkdocs build --strict failed (exit {returncode}):\n{output}")
    return folder


@pytest.fixture(scope="module")
def chromium():
    path = next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
    if path is None:
        message = "Chromium is needed to open the docs pages: apt-get install -y chromium"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A static HTTP server on 127.0.0.1 over a folder; yields (folder, base URL)."""
    root = tmp_path_factory.mktemp("served")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe."""

    def __init__(self, executable, profile):
        # The browser reads commands on its fd 3 and writes replies and events on its fd 4.
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (commands_read, replies_write)]
        os.close(commands_read)
        os.close(replies_write)

        def remap():  # in the child, before exec: the two pipe ends become fds 3 and 4
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--mute-audio",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=remap,
            pass_fds=(3, 4), close_fds=True)
        for fd in high:
            os.close(fd)
        self._stderr = []
        threading.Thread(target=lambda: self._stderr.extend(self.process.stderr), daemon=True).start()
        self._buffer = b""
        self._next_id = 0
        self._pending = []  # messages read while waiting for a reply

    def close(self):
        try:
            self.send("Browser.close")
        except (OSError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)

    def post(self, method, params=None, session=None):
        """Send a command; return its id without waiting."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        return self._next_id

    def read(self, timeout):
        """The next message from the browser, or None after `timeout` seconds without one."""
        if self._pending:
            return self._pending.pop(0)
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                return None
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe:\n" + b"".join(self._stderr).decode(errors="replace"))
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, params=None, session=None, timeout=30.0):
        """Send a command and wait for its reply; events read meanwhile stay queued for `read`."""
        wanted = self.post(method, params, session)
        held = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                message = self.read(max(0.0, deadline - time.monotonic()))
                if message is None:
                    raise RuntimeError(f"no reply to {method} within {timeout} s")
                if message.get("id") == wanted:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    return message.get("result", {})
                held.append(message)
        finally:
            self._pending[:0] = held


def describe(method, params):
    """The console error an event reports, or None if it reports none."""
    if method == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        text = details.get("exception", {}).get("description") or details.get("text", "")
        return f"uncaught exception: {text} ({details.get('url', '')}:{details.get('lineNumber', '?')})"
    if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
        args = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
        return f"console.{params['type']}: {args}"
    if method == "Log.entryAdded" and params["entry"]["level"] == "error":
        entry = params["entry"]
        return f"{entry.get('source', 'log')}: {entry.get('text', '')} {entry.get('url', '')}".strip()
    return None


def console_errors(executable, profile, urls):
    """url -> the console errors its page reported while loading, over one browser, TABS pages at a time."""
    browser = Browser(executable, profile)
    errors = {url: [] for url in urls}
    try:
        waiting = list(urls)
        open_tabs = {}  # session -> {"url", "target", "loaded" (time or None), "last" (time), "started"}
        while waiting or open_tabs:
            while waiting and len(open_tabs) < TABS:
                url = waiting.pop(0)
                target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
                session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
                for domain in ("Runtime", "Log", "Page"):
                    browser.send(f"{domain}.enable", session=session)
                now = time.monotonic()
                open_tabs[session] = {"url": url, "target": target, "loaded": None, "last": now, "started": now}
                browser.post("Page.navigate", {"url": url}, session=session)
            message = browser.read(0.1)
            now = time.monotonic()
            if message is not None and message.get("sessionId") in open_tabs:
                tab = open_tabs[message["sessionId"]]
                tab["last"] = now
                method, params = message.get("method"), message.get("params", {})
                if method == "Page.loadEventFired":
                    tab["loaded"] = now
                elif method is not None and (text := describe(method, params)):
                    errors[tab["url"]].append(text)
                elif "error" in message:
                    errors[tab["url"]].append(f"DevTools: {message['error']}")
            for session, tab in list(open_tabs.items()):
                settled = tab["loaded"] is not None and now - tab["last"] >= QUIET
                if not settled and now - tab["started"] > PAGE_TIMEOUT:
                    errors[tab["url"]].append(f"no load event within {PAGE_TIMEOUT} s")
                    settled = True
                if settled:
                    browser.post("Target.closeTarget", {"targetId": tab["target"]})
                    del open_tabs[session]
    finally:
        browser.close()
    return errors


def pages(site):
    return sorted(path.relative_to(site).as_posix() for path in site.rglob("*.html"))


def test_mkdocs_build_strict_succeeds(build):
    returncode, output, site = build
    assert returncode == 0, f"mkdocs build --strict failed (exit {returncode}):\n{output}"
    built = pages(site)
    for page in ("index.html", "reference/index.html", "reference/core/index.html", "benchmarks/index.html"):
        assert page in built, f"{page} was not built: {built}"


def test_every_top_level_name_is_rendered_on_a_reference_page(site):
    """Each name `import tvjax` exports has its own entry (an anchor `module.name`) in the API reference."""
    anchors = set()
    for path in (site / "reference").rglob("*.html"):
        anchors |= set(re.findall(r'id="(tvjax\.[\w.]+)"', path.read_text(encoding="utf-8")))
    missing = [f"{module}.{name}" for name, module in sorted(tvjax._EXPORTS.items()) if f"{module}.{name}" not in anchors]
    assert not missing, f"names of tvjax._EXPORTS without an entry in docs/reference/: {missing}"


def test_every_page_opens_without_console_errors(site, chromium, server, tmp_path):
    root, base = server
    shutil.copytree(site, root, dirs_exist_ok=True)  # at the root: 404.html links its assets from "/"
    urls = [f"{base}/{page}" for page in pages(site)]
    assert len(urls) >= 20, urls
    errors = console_errors(chromium, tmp_path / "profile", urls)
    found = {url: messages for url, messages in errors.items() if messages}
    assert not found, "console errors:\n" + "\n".join(f"{url}:\n  " + "\n  ".join(m) for url, m in found.items())


def test_console_error_detection_catches_broken_pages(chromium, server, tmp_path):
    """The check itself: a page that logs an error, one that throws, one whose script is missing are
    each reported; a clean page is not."""
    root, base = server
    folder = root / "_selfcheck"
    folder.mkdir()
    bodies = {
        "clean.html": "<p>fine</p><script>console.log('fine')</script>",
        "console.html": "<script>console.error('x')</script>",
        "throws.html": "<script>undefinedFunction()</script>",
        "missing.html": "<script src='missing.js'></script>",
    }
    head = "<link rel='icon' href='data:,'>"  # no request for /favicon.ico
    for name, body in bodies.items():
        (folder / name).write_text(f"<!doctype html><html><head><title>{name}</title>{head}</head><body>{body}</body></html>")
    errors = console_errors(chromium, tmp_path / "profile", [f"{base}/_selfcheck/{name}" for name in bodies])
    by_name = {url.rsplit("/", 1)[1]: messages for url, messages in errors.items()}
    assert by_name["clean.html"] == []
    assert any("console.error: x" in m for m in by_name["console.html"]), by_name
    assert any("undefinedFunction" in m for m in by_name["throws.html"]), by_name
    assert any("missing.js" in m or "404" in m for m in by_name["missing.html"]), by_name
