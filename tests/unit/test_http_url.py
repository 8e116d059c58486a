"""Both HTTP services (the sandbox's and temper serve's) say where they listen the same way."""

from tempering.sandbox.server import http_url


def test_an_ipv6_host_is_bracketed_and_an_ipv4_one_is_not():
    assert http_url(("127.0.0.1", 8000)) == "http://127.0.0.1:8000"
    assert http_url(("::1", 8000, 0, 0)) == "http://[::1]:8000"
