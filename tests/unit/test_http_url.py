"""Both HTTP services (the sandbox's and temper serve's) say where they listen the same way."""

from tempering.httpd import http_url


def test_an_ipv6_host_is_bracketed_and_an_ipv4_one_is_not():
    assert http_url(("127.0.0.1", 8000)) == "http://127.0.0.1:8000"
    assert http_url(("::1", 8000, 0, 0)) == "http://[::1]:8000"


def test_a_port_taken_on_the_ipv6_loopback_is_named_with_brackets(ipv6_loopback, tmp_path):
    """"cannot listen on ::1:8000" reads as an address with a port of 1:8000 or of 8000."""
    import socket

    import pytest

    from tempering.rollout.vllm_launch import LaunchedServer, VllmSettings

    settings = VllmSettings("float32", kv_cache_gib=0.5, threads=1, cpu_bind=None, compile=False, seed=0, cpu=True)
    with socket.socket(socket.AF_INET6) as other:
        other.bind((ipv6_loopback, 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"cannot listen on \\[::1\\]:{port} "):
            LaunchedServer(tmp_path, f"http://[::1]:{port}", settings)
