"""Helpers for the tests that talk to real servers on 127.0.0.1: ``temper serve`` as a subprocess
on a free port, a free port for any other server, and JSON requests. Not a test module; the
fixtures built on them are in ``conftest.py``."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


@contextmanager
def serving(tiny_model_dir, tempering_cache, *options: str) -> Iterator[str]:
    """``temper serve`` on the miniature model, on a free port of 127.0.0.1 (with more command
    line ``options``): its URL."""
    env = {**os.environ, "TEMPERING_CACHE": str(tempering_cache), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "tempering.cli", "serve", str(tiny_model_dir), "threads=1",
                                "--port", "0", "--quiet", *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, text=True)
    try:
        line = process.stdout.readline()
        assert " at http://" in line, process.stderr.read()
        yield line.split(" at ")[1].split()[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


class HangingUp(ThreadingHTTPServer):
    """A proxy on a free port in front of the server at ``target``, serving from a thread of its
    own, that hangs up unanswered on the completion requests ``hang_up(how many it hung up on so
    far)`` picks (what a client sees of a server killed mid-request; counted in ``hung_up``)
    and passes everything else through. Stop it with ``shutdown()``."""

    daemon_threads = True

    def __init__(self, target: str, hang_up: Callable[[int], bool] = lambda done: False):
        self.target, self.hang_up, self.hung_up = target, hang_up, 0
        super().__init__(("127.0.0.1", 0), _HangingUpHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HangingUpHandler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass

    def _forward(self, body):
        request = urllib.request.Request(self.server.target + self.path, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as reply:
            data = reply.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._forward(None)

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/completions" and self.server.hang_up(self.server.hung_up):
            self.server.hung_up += 1
            self.close_connection = True  # no answer at all: the client sees the connection close
            return
        self._forward(body)


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(url: str, body: dict | None = None, headers: dict | None = None) -> dict:
    """POST ``body`` as JSON (None: an empty POST); the reply's JSON (an HTTP error raises
    ``urllib.error.HTTPError``)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})},
                                     method="POST")
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def get(url: str) -> dict:
    """GET ``url``; the reply's JSON."""
    with urllib.request.urlopen(url, timeout=60) as reply:
        return json.loads(reply.read())


def perturbed(model, seed: int):
    """A copy of ``model`` with noise on every weight: new weights for a server to load, whose
    samples differ from the original's clearly (mean log-prob gap above 1e-3)."""
    changed = copy.deepcopy(model)
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=noise))
    return changed
