"""Helpers for the tests that talk to a real ``temper serve``: the server as a subprocess on a
free port of 127.0.0.1, and a JSON request to it. Not a test module; the fixtures built on
them are in ``conftest.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager


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


def post(url: str, body: dict, headers: dict | None = None) -> dict:
    """POST ``body`` as JSON; the reply's JSON (an HTTP error raises ``urllib.error.HTTPError``)."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                      **(headers or {})})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())
