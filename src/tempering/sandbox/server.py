"""HTTP service in front of an :class:`~tempering.sandbox.executor.Executor`.

Endpoints:

- ``POST /run_code``: SandboxFusion-compatible. Takes ``{code, language, stdin,
  run_timeout, memory_limit_MB}``, answers ``{status: Success|Failed|SandboxError,
  message, compile_result, run_result: {status, execution_time, return_code, stdout,
  stderr, ...}}``. ``run_result.status`` uses SandboxFusion's ``Finished``,
  ``TimeLimitExceeded`` and ``Error``; the extra keys ``sandbox_status``, ``signal`` and
  ``cpu_time`` carry this sandbox's finer result for :class:`SandboxClient`.
- ``POST /run_tests``: one test spec (as ``temper sandbox test`` reads) or a JSON list of
  them, run across the pool; answers the result or the list of results.
- ``GET /health``: liveness, isolation mode, slots and load.

Protection: a bearer token when one is set (required to bind beyond loopback), a cap on
the request body, on open connections and on queued jobs (``429`` with ``Retry-After``
when the queue is full, ``503`` when connections are). Not done: TLS (put a proxy in
front), per-client quotas.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
import threading
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tempering.sandbox.spec import Limits, RunRequest, SpecError, TestSpec

MAX_BODY_BYTES = 16 << 20
_NO_BODY = object()  # what _read_json returns once it has answered with an error
_FUSION_RUN_STATUS = {"ok": "Finished", "timeout": "TimeLimitExceeded"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_code_response(result) -> dict:
    """A RunResult in SandboxFusion's ``/run_code`` response shape."""
    if result.status == "sandbox_error":
        status = "SandboxError"
    else:
        status = "Success" if result.status == "ok" else "Failed"
    details = {"status": _FUSION_RUN_STATUS.get(result.status, "Error"),
               "execution_time": result.wall_s, "return_code": result.exit_code,
               "stdout": result.stdout, "stderr": result.stderr,
               "sandbox_status": result.status, "signal": result.signal,
               "cpu_time": result.cpu_s}
    compiled = None
    if result.status == "compile_error":
        compiled, details = dict(details, status="Error"), None
    return {"status": status, "message": "" if status == "Success" else result.status,
            "compile_result": compiled, "run_result": details}


def run_request_from_fusion(body: dict) -> RunRequest:
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        raise SpecError("/run_code needs a JSON object with a string 'code'")
    stdin = body.get("stdin") or ""
    if not isinstance(stdin, str):
        raise SpecError("'stdin' must be a string")
    if not isinstance(body.get("language", "python"), str):
        raise SpecError("'language' must be a string such as 'python'")
    limits = Limits(timeout_s=body.get("run_timeout", 5.0),
                    memory_mb=body.get("memory_limit_MB", 512))
    return RunRequest(body["code"], body.get("language", "python"), stdin, limits)


class SandboxHTTPServer(ThreadingHTTPServer):
    """One thread per connection, capped; jobs counted against a bounded queue."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, executor, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_queue: int | None = None, max_connections: int = 256,
                 max_body_bytes: int = MAX_BODY_BYTES):
        if not token and not is_loopback(host):
            raise ValueError(f"refusing to serve on {host} without a token: pass --token, or "
                             "bind 127.0.0.1")
        self.executor, self.token, self.max_body_bytes = executor, token, max_body_bytes
        self.max_queue = max_queue or executor.workers * 32
        self.max_connections = max_connections
        self.queued = self.connections = 0
        self.lock = threading.Lock()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def process_request(self, request, client_address):
        with self.lock:
            full = self.connections >= self.max_connections
            if not full:
                self.connections += 1
        if full:
            _refuse(request, HTTPStatus.SERVICE_UNAVAILABLE, "too many open connections")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.connections -= 1

    def reserve(self, jobs: int) -> bool:
        with self.lock:
            if self.queued + jobs > self.max_queue:
                return False
            self.queued += jobs
            return True

    def release(self, jobs: int) -> None:
        with self.lock:
            self.queued -= jobs


def _refuse(sock, status: HTTPStatus, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.sendall(head + body)
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections are closed after a minute
    server: SandboxHTTPServer

    def log_message(self, format, *args):  # noqa: A002 - the base class names it so
        """Quiet: one line per request would drown a load test."""

    def _send(self, status: int, payload, headers: dict | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if not self.server.token:
            return True
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.server.token}".encode()):
            return True
        self.close_connection = True  # the unread body would corrupt the next request
        self._send(401, {"error": "missing or wrong bearer token"},
                   {"WWW-Authenticate": "Bearer"})
        return False

    def _read_json(self):
        """The body's JSON value (``null`` included), or ``_NO_BODY`` after answering an error."""
        length = self.headers.get("Content-Length")
        if length is None or not (length.isascii() and length.isdigit()):
            self.close_connection = True
            self._send(411, {"error": "a Content-Length header is required"})
            return _NO_BODY
        if int(length) > self.server.max_body_bytes:
            self.close_connection = True
            self._send(413, {"error": f"request body over {self.server.max_body_bytes} bytes"})
            return _NO_BODY
        try:
            return json.loads(self.rfile.read(int(length)))
        except ValueError:
            self._send(400, {"error": "the request body is not valid JSON"})
        except RecursionError:
            self._send(400, {"error": "the request body is JSON nested too deeply"})
        return _NO_BODY

    def do_GET(self):
        if self.path != "/health":
            self._send(404, {"error": f"no such endpoint: GET {self.path}"})
            return
        server = self.server
        self._send(200, {"status": "ok", "isolation": server.executor.isolation,
                         "workers": server.executor.workers, "queued": server.queued,
                         "max_queue": server.max_queue})

    def do_POST(self):
        routes = {"/run_code": self._run_code, "/run_tests": self._run_tests}
        route = routes.get(self.path)
        if route is None:
            self._send(404, {"error": f"no such endpoint: POST {self.path}"})
            return
        if not self._authorized():
            return
        body = self._read_json()
        if body is not _NO_BODY:
            route(body)

    def _with_queue(self, jobs: int, work):
        if not self.server.reserve(jobs):
            self._send(429, {"error": "the sandbox queue is full; retry shortly"},
                       {"Retry-After": "1"})
            return
        try:
            status, payload = work()
        except SpecError as err:
            status, payload = 400, {"error": str(err)}
        except RuntimeError as err:
            status, payload = 503, {"error": f"the sandbox is unavailable: {err}"}
        except Exception as err:  # a defect here; the client still gets an answer
            traceback.print_exc()
            status, payload = 500, {"error": f"internal error: {type(err).__name__}: {err}"}
        finally:
            self.server.release(jobs)
        self._send(status, payload)

    def _run_code(self, body):
        def work():
            result = self.server.executor.run(run_request_from_fusion(body))
            return 200, run_code_response(result)
        self._with_queue(1, work)

    def _run_tests(self, body):
        batch = isinstance(body, list)
        specs_json = body if batch else [body]

        def work():
            specs = [TestSpec.from_dict(spec) for spec in specs_json]
            results = self.server.executor.test_many(specs)
            payload = [dict(r.to_dict(), verdict=r.verdict) for r in results]
            return 200, payload if batch else payload[0]
        self._with_queue(max(1, len(specs_json)), work)
