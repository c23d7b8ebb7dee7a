"""A local stand-in for an OpenAI-compatible endpoint: the reply half every fake server shares."""

import json
from http.server import BaseHTTPRequestHandler


class JSONHandler(BaseHTTPRequestHandler):
    """A handler that answers JSON over HTTP/1.1 keep-alive and logs nothing; subclasses decide what."""

    protocol_version = "HTTP/1.1"

    def read_json(self):
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def send_json(self, status, reply):
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass
