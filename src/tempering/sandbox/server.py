"""HTTP service in front of an :class:`~tempering.sandbox.executor.Executor`.

Endpoints:

- ``POST /run_code``: SandboxFusion's, with its request and answer semantics (see
  :mod:`tempering.sandbox.fusion`).
- ``POST /run_tests``: one test spec (as ``temper sandbox test`` reads) or a JSON list of
  at most ``max_queue`` of them, run across the pool; answers the result or the list.
- ``GET /health``: liveness, isolation mode, slots, load, ``max_queue``, the languages (as
  SandboxFusion's client names them) and ``memory_mb``, the most a process gets (what
  ``memory_limit_MB`` -1 gets). ``GET /v1/ping``: SandboxFusion's liveness check.
- SandboxFusion's Jupyter and dataset endpoints (``run_jupyter``, ``submit``,
  ``get_prompts`` and the rest of its online-judge API) answer 501 saying so: this service
  runs programs, it holds no datasets and no kernels.

Queue: jobs wait their turn for a slot in arrival order. ``/run_code`` is not capped, as
SandboxFusion is not: it waits as long as its client waits for the answer (a client that
closes its connection takes its request out of the queue), at most ``max_wait_s`` (a
bound for sanity, 600 s), then answers 504 with ``Retry-After``. Giving up sooner failed
verl's reward code, which retries 504 a few times only and scores a failed request as a
wrong answer. A ``/run_tests`` batch first takes room for its jobs among ``max_queue``,
waiting for it at most ``BATCH_WAIT_S`` (then 504), and once in runs to its end; one
larger than ``max_queue`` could never fit and is refused at once with 413 naming the limit.

Authentication: with a token set (required to bind beyond loopback), a request carries it
as ``Authorization: Bearer T``, as the first path segment (``/T/run_code``: the official
client takes the endpoint ``http://HOST:PORT/T``, verl the URL ``http://HOST:PORT/T/run_code``)
or as a query (``/run_code?token=T``). A token in a URL can end up in the logs of proxies on
the way; the header cannot. ``/health`` and ``/v1/ping`` need none.

Protection: a cap on the request body, and at most ``max_connections`` connections served
at once: past it, connections are not accepted until one closes, so they wait in the
listen backlog (``request_queue_size``) instead of being refused (a 503, which verl does
not retry). Not done: TLS (put a proxy in front), per-client quotas.
"""

from __future__ import annotations

import collections
import hmac
import json
import threading
import time
import traceback
import urllib.parse
from concurrent.futures import CancelledError, ThreadPoolExecutor
from functools import partial
from http.server import BaseHTTPRequestHandler

from tempering.httpd import HTTPServer, is_loopback, peer_closed
from tempering.sandbox import fusion, harness
from tempering.sandbox.spec import SpecError, TestSpec

MAX_BODY_BYTES = 16 << 20
BATCH_WAIT_S = 30.0
MAX_WAIT_S = 600.0  # the longest a /run_code request waits for a slot: a bound for sanity only
GONE_CHECK_S = 0.5  # how often a waiting request looks whether its client is still there
_NO_BODY = object()  # what _read_json returns once it has answered with an error
# SandboxFusion endpoints this service does not have (its Jupyter runner and online judge).
ABSENT = frozenset(("run_jupyter", "submit", "get_prompts", "get_prompt_by_id", "list_datasets",
                    "list_ids", "get_metrics", "get_metrics_function"))


class QueueTimeout(Exception):
    """A job found no room or no slot before its deadline."""


class ClientGone(Exception):
    """The client of a waiting request closed its connection: nobody would read the answer."""


class FifoSemaphore:
    """``units`` taken and given back in arrival order: a request never overtakes an earlier
    one, so a batch waiting for room is not starved by a stream of single runs."""

    def __init__(self, units: int):
        self.units = self.free = units
        self._waiting = collections.deque()
        self._changed = threading.Condition()
        self._closed = False

    @property
    def used(self) -> int:
        return self.units - self.free

    def acquire(self, count: int, deadline: float | None, gone=None) -> None:
        """Take ``count`` units; QueueTimeout at ``deadline`` (a monotonic time, None: never),
        ClientGone once ``gone()`` says the waiting request's client left (asked every
        ``GONE_CHECK_S``), RuntimeError once closed."""
        ticket = object()
        with self._changed:
            self._waiting.append(ticket)
            try:
                while self._closed or self._waiting[0] is not ticket or self.free < count:
                    if self._closed:
                        raise RuntimeError("the sandbox service is stopping")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise QueueTimeout()
                    if gone is not None:
                        if gone():
                            raise ClientGone()
                        left = GONE_CHECK_S if left is None else min(left, GONE_CHECK_S)
                    self._changed.wait(left)
                self.free -= count
            finally:
                self._waiting.remove(ticket)
                self._changed.notify_all()

    def release(self, count: int) -> None:
        with self._changed:
            self.free += count
            self._changed.notify_all()

    def close(self) -> None:
        """Wake every waiter with RuntimeError; later acquires fail at once."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class SandboxHTTPServer(HTTPServer):
    """One thread per connection, at most ``max_connections`` at once (further connections
    wait in the listen backlog, not accepted, until one ends); jobs queued for the
    executor's slots."""

    request_queue_size = 4096  # the listen backlog (the kernel caps it at net.core.somaxconn)

    def __init__(self, executor, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 max_queue: int | None = None, max_connections: int = 256,
                 max_body_bytes: int = MAX_BODY_BYTES, max_memory_mb: int = 4096,
                 max_wait_s: float = MAX_WAIT_S):
        if not token and not is_loopback(host):
            raise ValueError(f"refusing to serve on {host} without a token: pass --token, or "
                             "bind 127.0.0.1")
        self.executor, self.token, self.max_body_bytes = executor, token, max_body_bytes
        self.max_queue = max_queue or executor.workers * 32
        self.max_connections, self.max_memory_mb, self.max_wait_s = max_connections, max_memory_mb, max_wait_s
        self.room, self.slots = FifoSemaphore(self.max_queue), FifoSemaphore(executor.workers)
        self.batches = ThreadPoolExecutor(executor.workers, thread_name_prefix="sandbox-batch")
        self.connections = self.waiting_runs = 0
        self.lock = threading.Condition()
        self._stopping = False
        super().__init__(host, port, _Handler)

    @property
    def queued(self) -> int:
        """Jobs held: /run_tests batches' and /run_code requests', running or waiting."""
        return self.room.used + self.waiting_runs

    def get_request(self):
        """Accept a connection once fewer than ``max_connections`` are open; until then the
        kernel holds it in the backlog, so its client waits instead of being refused."""
        with self.lock:
            while self.connections >= self.max_connections:
                if self._stopping:
                    raise OSError("the sandbox service is stopping")
                self.lock.wait(GONE_CHECK_S)
        request = super().get_request()
        with self.lock:
            self.connections += 1
        return request

    def shutdown_request(self, request):
        """Close a connection and make room for the next (in the connection's thread, or
        in the accepting one when no thread could start)."""
        super().shutdown_request(request)
        with self.lock:
            self.connections -= 1
            self.lock.notify_all()

    def shutdown(self) -> None:
        with self.lock:
            self._stopping = True
            self.lock.notify_all()
        super().shutdown()

    def execute(self, job: dict, timeout_s: float, deadline: float | None = None, gone=None) -> dict:
        """Run one worker job once a slot is free (QueueTimeout past ``deadline``, ClientGone
        once ``gone()``)."""
        self.slots.acquire(1, deadline, gone)
        try:
            return self.executor.execute(job, timeout_s)
        finally:
            self.slots.release(1)

    def server_close(self) -> None:
        """Stop taking jobs: waiting requests get 503; running ones end with the executor."""
        self.room.close()
        self.slots.close()
        self.batches.shutdown(wait=False, cancel_futures=True)
        super().server_close()


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

    def _route(self):
        """``(endpoint, tokens offered)``: from the path (``/ENDPOINT`` or ``/TOKEN/ENDPOINT``),
        its query and the headers."""
        parts = urllib.parse.urlsplit(self.path)
        tokens = urllib.parse.parse_qs(parts.query).get("token", [])
        given = self.headers.get("Authorization", "")
        if given.startswith("Bearer "):
            tokens.append(given[len("Bearer "):])
        path = parts.path.strip("/")
        segments = path.split("/")
        if len(segments) == 2 and path != "v1/ping":
            tokens.append(segments[0])
            path = segments[1]
        return path, tokens

    def _authorized(self, tokens) -> bool:
        expected = self.server.token
        if not expected or any(hmac.compare_digest(t.encode(), expected.encode()) for t in tokens):
            return True
        self.close_connection = True  # the unread body would corrupt the next request
        self._send(401, {"error": "missing or wrong token: send 'Authorization: Bearer TOKEN', "
                                  "or put it in the URL as /TOKEN/run_code or ?token=TOKEN"},
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
        endpoint, _ = self._route()
        server = self.server
        if endpoint == "v1/ping":
            self._send(200, "pong")
        elif endpoint == "health":
            self._send(200, {"status": "ok", "isolation": server.executor.isolation,
                             "workers": server.executor.workers, "queued": server.queued,
                             "running": server.slots.used, "max_queue": server.max_queue,
                             "memory_mb": server.max_memory_mb, "languages": fusion.offered_names()})
        else:
            self._send(404, {"error": f"no such endpoint: GET {self.path}"})

    def do_POST(self):
        endpoint, tokens = self._route()
        routes = {"run_code": self._run_code, "run_tests": self._run_tests}
        if endpoint not in routes and endpoint not in ABSENT:
            self._send(404, {"error": f"no such endpoint: POST {self.path}"})
            return
        if not self._authorized(tokens):
            return
        body = self._read_json()
        if body is _NO_BODY:
            return
        if endpoint in ABSENT:
            self._send(501, {"error": f"/{endpoint} is SandboxFusion's and not offered here: this "
                                      "service runs programs (/run_code, /run_tests); it has no "
                                      "Jupyter kernels and no datasets"})
            return
        routes[endpoint](body)

    @staticmethod
    def _attempt(work):
        """``work()`` -> (status, payload), as ``(status, payload, headers)``, its failures
        answered as what they mean to the client."""
        try:
            status, payload = work()
            return status, payload, None
        except QueueTimeout:
            return 504, {"error": "no sandbox slot came free in time; retry shortly"}, {"Retry-After": "1"}
        except SpecError as err:
            return 400, {"error": str(err)}, None
        except (RuntimeError, CancelledError) as err:  # the service is stopping
            return 503, {"error": f"the sandbox is unavailable: {err or 'stopping'}"}, {"Retry-After": "1"}
        except ClientGone:
            raise
        except Exception as err:  # a defect here; the client still gets an answer
            traceback.print_exc()
            return 500, {"error": f"internal error: {type(err).__name__}: {err}"}, None

    def _answer(self, jobs: int, deadline: float | None, work) -> None:
        """Take room for ``jobs``, run ``work()`` -> (status, payload), and answer it."""
        try:
            self.server.room.acquire(jobs, deadline)
        except QueueTimeout:
            self._send(504, {"error": "the sandbox queue stayed full; retry shortly"}, {"Retry-After": "1"})
            return
        except RuntimeError as err:
            self._send(503, {"error": str(err)}, {"Retry-After": "1"})
            return
        try:
            answer = self._attempt(work)
        finally:
            self.server.room.release(jobs)
        self._send(*answer)

    def _run_code(self, body):
        """One program, as SandboxFusion runs it: no cap on the queue, the request waits for a
        slot as long as its client waits for the answer (at most ``max_wait_s``); a client
        that leaves meanwhile takes its job out of the queue."""
        try:
            request = fusion.parse_request(body, self.server.max_memory_mb)
        except SpecError as err:
            self._send(400, {"error": str(err)})
            return
        except fusion.LanguageMissing as err:
            self._send(200, fusion.answer("Failed", str(err)))
            return
        server = self.server
        gone = partial(peer_closed, self.connection)

        def work():
            job = fusion.build_job(request)
            reply = server.execute(job.job, job.budget_s, time.monotonic() + server.max_wait_s, gone)
            return 200, fusion.response(job, reply)
        with server.lock:
            server.waiting_runs += 1
        try:
            answer = self._attempt(work)
        except ClientGone:
            self.close_connection = True
            return
        finally:
            with server.lock:
                server.waiting_runs -= 1
        self._send(*answer)

    def _run_tests(self, body):
        batch = isinstance(body, list)
        try:
            specs = [TestSpec.from_dict(spec) for spec in (body if batch else [body])]
        except SpecError as err:
            self._send(400, {"error": str(err)})
            return
        if len(specs) > self.server.max_queue:
            self._send(413, {"error": f"a batch of {len(specs)} specs is over this service's "
                                      f"max_queue of {self.server.max_queue}: send at most that "
                                      "many per request (GET /health says it)"})
            return

        def work():
            results = list(self.server.batches.map(partial(harness.run_tests, self.server.execute), specs))
            payload = [dict(r.to_dict(), verdict=r.verdict) for r in results]
            return 200, payload if batch else payload[0]
        self._answer(max(1, len(specs)), time.monotonic() + BATCH_WAIT_S, work)
