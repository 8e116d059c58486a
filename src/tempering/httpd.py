"""The HTTP base that tempering's two services share: ``temper serve`` (OpenAI-compatible
sampling, :mod:`tempering.rollout.server`) and ``temper sandbox serve`` (SandboxFusion's API,
:mod:`tempering.sandbox.server`).

Both are threaded servers on the standard library's :mod:`http.server`: a thread per
connection, blocking handlers that call the sampler or the sandbox directly. Neither needs an
event loop, and tempering's core install stays free of a web framework. What an ASGI server
tells a handler for free, that its client hung up, a handler here asks for itself while it
waits (:func:`peer_closed`, :func:`client_gone`), so that work nobody will read is dropped.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import threading
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Iterator


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int | str) -> str:
    """``host:port`` as a URL writes it: an IPv6 host in brackets.

    >>> host_port("127.0.0.1", 8000), host_port("::1", 8000)
    ('127.0.0.1:8000', '[::1]:8000')
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_url(address: tuple) -> str:
    """``http://host:port`` of a listening socket's ``server_address``, an IPv6 host in brackets."""
    return f"http://{host_port(*address[:2])}"


class HTTPServer(ThreadingHTTPServer):
    """A threading HTTP server on an IPv4 or IPv6 ``host`` (the socket family follows the
    address; the base class always opens IPv4), saying where it listens as :func:`http_url`."""

    def __init__(self, host: str, port: int, handler: type):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), handler)

    @property
    def url(self) -> str:
        return http_url(self.server_address)


class ClientGone(Exception):
    """The client of the request being answered hung up: there is no one to answer."""


def peer_closed(connection: socket.socket) -> bool:
    """Whether the client at the other end of ``connection`` has closed it: the socket reads as
    ready and a peek finds the end of the stream (a reset or a closed socket counts too). Bytes
    waiting (a pipelined request) are left where they are and do not count. A client that only
    shuts down its sending side (rare) reads as gone too, as it does to an ASGI server."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or the socket is closed already
        return True


_answering = threading.local()


@contextmanager
def answering(connection: socket.socket) -> Iterator[None]:
    """Mark ``connection`` as the one this thread is answering, for :func:`client_gone` (the
    code that waits on a request's work is given its body, not its socket)."""
    _answering.connection = connection
    try:
        yield
    finally:
        _answering.connection = None


def client_gone() -> bool:
    """Whether the client of the request this thread is answering has hung up (False outside
    :func:`answering`)."""
    connection = getattr(_answering, "connection", None)
    return connection is not None and peer_closed(connection)
