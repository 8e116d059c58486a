"""Client for ``temper sandbox serve``, with the same methods as the local Executor.

Rewards take "something with ``run``/``test``": an :class:`Executor` on this machine or a
:class:`SandboxClient` for a pool elsewhere. Each thread keeps its own keep-alive
connection. ``test_many`` sends batches to ``/run_tests`` so the server can spread them
over its slots, each at most the service's ``max_queue`` specs (from ``/health``), which
is the most it takes at once; ``run_many`` sends requests concurrently. An answer that the
service is full (429, 503 or 504) is retried after its ``Retry-After`` for as long as
``timeout_s`` allows, with one logged warning per client, since every such wait slows the
rewards down; other HTTP errors raise ``SandboxHTTPError``.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from tempering.sandbox.spec import (RunRequest, RunResult, SandboxAPI, SpecError, TestResult,
                                    TestSpec)

LOG = logging.getLogger("tempering.sandbox")
_FULL = (429, 503, 504)  # the service is full or stopping: worth waiting and sending again


class SandboxHTTPError(RuntimeError):
    """The sandbox service answered with an error (its HTTP ``status``) or could not be
    reached (``status`` None)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def run_result_from_fusion(response: dict) -> RunResult:
    """The RunResult of a ``/run_code`` answer (this service's, or a SandboxFusion's, whose
    finer status is then read from its labels)."""
    if response.get("status") == "SandboxError":
        return RunResult("sandbox_error", None, None, "", response.get("message", ""), 0.0, 0.0)
    details, status = response.get("run_result"), None
    if details is None:
        details, status = response.get("compile_result"), "compile_error"
    if details is None:  # nothing ran: a language the service cannot run
        raise SpecError(response.get("message") or "the sandbox service ran nothing")
    code = details.get("return_code")
    if status is None:
        status = details.get("sandbox_status") or (
            "timeout" if details["status"] == "TimeLimitExceeded" else "ok" if code == 0 else "runtime_error")
    return RunResult(status, code if code is not None and code >= 0 else None, details.get("signal"),
                     details.get("stdout") or "", details.get("stderr") or "",
                     details.get("execution_time") or 0.0, details.get("cpu_time") or 0.0)


class SandboxClient(SandboxAPI):
    """Talks to a sandbox service at ``url`` (``http://host:port``), optionally with a token."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 600.0,
                 concurrency: int = 32):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"sandbox URL must look like http://HOST:PORT, got {url!r}")
        self.url, self.host, self.port = url, parts.hostname, parts.port or 80
        self.token, self.timeout_s = token, timeout_s
        self._max_batch = None  # the service's max_queue, asked once
        self._warned = False
        self._local = threading.local()
        self._connections = []
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix="sandbox-client")

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def _request(self, method: str, path: str, payload=None):
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        give_up = time.monotonic() + self.timeout_s
        while True:
            status, text, retry_after = self._round_trip(method, path, body, headers)
            if status not in _FULL or time.monotonic() + retry_after > give_up:
                break
            self._warn_full(path, status, text)
            time.sleep(retry_after)
        if status != 200:
            raise SandboxHTTPError(f"{method} {path} answered {status}: {text[:500]}", status)
        return json.loads(text)

    def _warn_full(self, path: str, status: int, text: str) -> None:
        with self._lock:
            warned, self._warned = self._warned, True
        if not warned:
            LOG.warning("the sandbox service at %s is full (%s answered %d: %s); requests wait "
                        "and are sent again, which slows every reward that needs it: give it more "
                        "--workers, or more services", self.url, path, status, text[:200])

    def _round_trip(self, method, path, body, headers):
        """One request; a keep-alive connection the server closed meanwhile is reopened once."""
        try:
            return self._exchange(method, path, body, headers)
        except (http.client.HTTPException, OSError):
            self._connection().close()
        try:
            return self._exchange(method, path, body, headers)
        except (http.client.HTTPException, OSError) as err:
            self._connection().close()
            raise SandboxHTTPError(f"cannot reach the sandbox at {self.host}:{self.port}: {err}") from err

    def _exchange(self, method, path, body, headers):
        connection = self._connection()
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
        return response.status, text, float(response.headers.get("Retry-After", "1"))

    def health(self) -> dict:
        return self._request("GET", "/health")

    def authenticate(self) -> None:
        """Send an authenticated request that runs nothing (an empty ``/run_tests`` batch):
        ``SandboxHTTPError`` with 401 when the service refuses this client's token (or its
        lack of one), which ``/health``, open to all, cannot tell."""
        self._request("POST", "/run_tests", [])

    def run(self, request: RunRequest) -> RunResult:
        payload = {"code": request.code, "language": request.language, "stdin": request.stdin,
                   "run_timeout": request.limits.timeout_s,
                   "memory_limit_MB": request.limits.memory_mb}
        return run_result_from_fusion(self._request("POST", "/run_code", payload))

    def test(self, spec: TestSpec) -> TestResult:
        return TestResult.from_dict(self._request("POST", "/run_tests", spec.to_dict()))

    def run_many(self, requests) -> list:
        return list(self._threads.map(self.run, requests))

    def _batch_size(self) -> int:
        """The service's ``max_queue``; 0 for a service that does not say (no split)."""
        if self._max_batch is None:
            self._max_batch = int(self.health().get("max_queue") or 0)
        return self._max_batch

    def test_many(self, specs) -> list:
        """Every spec's result, sent in batches of at most the service's ``max_queue``."""
        specs = list(specs)
        if not specs:
            return []
        results, size = [], self._batch_size() or len(specs)
        for start in range(0, len(specs), size):
            answers = self._request("POST", "/run_tests", [s.to_dict() for s in specs[start:start + size]])
            results += [TestResult.from_dict(answer) for answer in answers]
        return results

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
