"""Client for ``temper sandbox serve``, with the same methods as the local Executor.

Rewards take "something with ``run``/``test``": an :class:`Executor` on this machine or a
:class:`SandboxClient` for a pool elsewhere. Each thread keeps its own keep-alive
connection. ``test_many`` sends one batch to ``/run_tests`` so the server can spread it
over its slots; ``run_many`` sends requests concurrently. A ``429`` (queue full) is
retried after the server's ``Retry-After``; other HTTP errors raise ``SandboxHTTPError``.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from tempering.sandbox.spec import RunRequest, RunResult, SandboxAPI, TestResult, TestSpec


class SandboxHTTPError(RuntimeError):
    """The sandbox service answered with an error or could not be reached."""


def run_result_from_fusion(response: dict) -> RunResult:
    details = response.get("run_result") or response.get("compile_result") or {}
    if response.get("status") == "SandboxError" and not details:
        return RunResult("sandbox_error", None, None, "", response.get("message", ""), 0.0, 0.0)
    return RunResult(details.get("sandbox_status", "runtime_error"), details.get("return_code"),
                     details.get("signal"), details.get("stdout", ""), details.get("stderr", ""),
                     details.get("execution_time", 0.0), details.get("cpu_time", 0.0))


class SandboxClient(SandboxAPI):
    """Talks to a sandbox service at ``url`` (``http://host:port``), optionally with a token."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 600.0,
                 concurrency: int = 32, max_retries: int = 20):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"sandbox URL must look like http://HOST:PORT, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.token, self.timeout_s, self.max_retries = token, timeout_s, max_retries
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
        for _ in range(self.max_retries + 1):
            status, text, retry_after = self._round_trip(method, path, body, headers)
            if status != 429:
                break
            time.sleep(retry_after)
        if status != 200:
            raise SandboxHTTPError(f"{method} {path} answered {status}: {text[:500]}")
        return json.loads(text)

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

    def run(self, request: RunRequest) -> RunResult:
        payload = {"code": request.code, "language": request.language, "stdin": request.stdin,
                   "run_timeout": request.limits.timeout_s,
                   "memory_limit_MB": request.limits.memory_mb}
        return run_result_from_fusion(self._request("POST", "/run_code", payload))

    def test(self, spec: TestSpec) -> TestResult:
        return TestResult.from_dict(self._request("POST", "/run_tests", spec.to_dict()))

    def run_many(self, requests) -> list:
        return list(self._threads.map(self.run, requests))

    def test_many(self, specs) -> list:
        specs = list(specs)
        if not specs:
            return []
        answers = self._request("POST", "/run_tests", [spec.to_dict() for spec in specs])
        return [TestResult.from_dict(answer) for answer in answers]

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
