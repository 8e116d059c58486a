"""Weights sent over HTTP in chunks (``tempering.rollout.weight_transfer``): the assembly of
chunks in any order, what a missing or corrupted chunk does, the sender's chunking, and the
swap on ``temper serve``'s side (``Server.commit_transfer``): the served weights and policy
version change at the commit alone, whole, never while a sampler call runs, and not at all
when the transfer fails."""

from __future__ import annotations

import copy
import hashlib
import threading

import pytest
import torch

from tempering.rollout.hf import HFGenerator
from tempering.rollout.openai_api import RequestError
from tempering.rollout.server import Server
from tempering.rollout.weight_transfer import Assembly, Payload, send, weights_payload


def payload_of(data: bytes) -> Payload:
    return Payload("weights", data, hashlib.sha256(data).hexdigest())


def begin(assembly: Assembly, data: bytes, version: int = 1) -> str:
    return assembly.begin(payload_of(data).header(version))["transfer"]


def chunk(assembly: Assembly, transfer: str, offset: int, data: bytes) -> dict:
    return assembly.chunk({"transfer": transfer, "offset": str(offset), "data": data})


def test_chunks_in_any_order_are_assembled_into_the_payload():
    data = bytes(range(256)) * 7
    assembly = Assembly(limit_bytes=1 << 20)
    transfer = begin(assembly, data)
    for offset in (1000, 0, 500, 1500, 500):  # out of order, one sent twice (a retry)
        chunk(assembly, transfer, offset, data[offset:offset + 500])
    done = assembly.commit({"transfer": transfer})
    assert done.data == data and done.header["version"] == 1
    assert assembly.open is None


def test_a_missing_chunk_is_named_at_the_commit_and_the_transfer_is_dropped():
    data = b"x" * 1000
    assembly = Assembly(limit_bytes=1 << 20)
    transfer = begin(assembly, data)
    chunk(assembly, transfer, 0, data[:400])
    chunk(assembly, transfer, 600, data[600:])
    with pytest.raises(RequestError, match=r"200 of 1000 bytes never came \(ranges 400-600\)"):
        assembly.commit({"transfer": transfer})
    with pytest.raises(RequestError, match="no open transfer") as raised:
        assembly.commit({"transfer": transfer})
    assert raised.value.status == 409


def test_a_corrupted_chunk_fails_the_checksum():
    data = bytes(range(200))
    assembly = Assembly(limit_bytes=1 << 20)
    transfer = begin(assembly, data)
    chunk(assembly, transfer, 0, data[:100])
    chunk(assembly, transfer, 100, bytes([data[100] ^ 1]) + data[101:])  # one bit flipped on the way
    with pytest.raises(RequestError, match=f"not {hashlib.sha256(data).hexdigest()} as announced"):
        assembly.commit({"transfer": transfer})


def test_a_new_transfer_replaces_an_open_one_and_bad_requests_are_refused():
    assembly = Assembly(limit_bytes=100)
    first = begin(assembly, b"a" * 10)
    second = begin(assembly, b"b" * 10)
    with pytest.raises(RequestError, match="no open transfer"):
        chunk(assembly, first, 0, b"a" * 10)
    with pytest.raises(RequestError, match="does not fit"):
        chunk(assembly, second, 5, b"b" * 10)
    chunk(assembly, second, 0, b"b" * 6)
    with pytest.raises(RequestError, match="overlaps the chunk at 0"):
        chunk(assembly, second, 4, b"b" * 6)
    with pytest.raises(RequestError, match="this server's limit") as raised:
        begin(assembly, b"c" * 101)
    assert raised.value.status == 413
    with pytest.raises(RequestError, match="sha256"):
        assembly.begin({"kind": "weights", "bytes": 10, "sha256": "abc", "version": 1})
    with pytest.raises(RequestError, match="adapter_config"):
        assembly.begin({**payload_of(b"d").header(1), "kind": "adapter"})


@pytest.mark.parametrize("size, chunk_bytes, chunks", [(1000, 300, 4), (900, 300, 3), (10, 1 << 20, 1)])
def test_send_cuts_the_payload_into_chunks_of_chunk_bytes(size, chunk_bytes, chunks):
    data = bytes(i % 251 for i in range(size))
    assembly, sent = Assembly(limit_bytes=1 << 20), []

    def request(method, path, body, url, failover):  # the server's routes, without HTTP
        if path == "/weights/begin":
            return assembly.begin(body)
        if path == "/weights/commit":
            done = assembly.commit(body)
            return {"success": True, "policy_version": done.header["version"], "data": done.data}
        query = dict(part.split("=") for part in path.split("?")[1].split("&"))
        sent.append(len(body))
        return assembly.chunk({**query, "data": body})

    reply = send(request, "http://server", payload_of(data), 7, chunk_bytes, failover=False)
    assert reply["data"] == data and reply["policy_version"] == 7
    assert len(sent) == chunks and max(sent) <= chunk_bytes


@pytest.fixture
def server(tiny_policy):
    model, tokenizer = tiny_policy
    return Server(HFGenerator(copy.deepcopy(model), tokenizer), "mini", batch_size=8)


def moved(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v + 0.01 for k, v in model.state_dict().items()}


def transfer(server: Server, payload: Payload, version: int, corrupt: bool = False) -> str:
    """Begin ``payload`` and send all its chunks (the last one with a bit flipped if ``corrupt``)."""
    name = server.assembly.begin(payload.header(version))["transfer"]
    data = bytearray(payload.data)
    if corrupt:
        data[-1] ^= 1
    for offset in range(0, len(data), 4096):
        server.assembly.chunk({"transfer": name, "offset": str(offset), "data": bytes(data[offset:offset + 4096])})
    return name


def served(server: Server) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in server.sampler.model.state_dict().items()}


def test_the_weights_and_version_change_at_the_commit_alone(server):
    before = served(server)
    new = moved(server.sampler.model)
    name = transfer(server, weights_payload(new), version=5)
    assert server.models()["data"][0]["policy_version"] == 0, "assembled beside the model: nothing served yet"
    assert all(torch.equal(before[k], v) for k, v in served(server).items())
    reply = server.commit_transfer({"transfer": name})
    assert reply["success"] and reply["policy_version"] == 5 == server.models()["data"][0]["policy_version"]
    assert all(torch.equal(new[k], v) for k, v in served(server).items())


def test_a_corrupted_transfer_leaves_the_weights_and_version_serving(server):
    before = served(server)
    name = transfer(server, weights_payload(moved(server.sampler.model)), version=1, corrupt=True)
    with pytest.raises(RequestError, match="SHA-256"):
        server.commit_transfer({"transfer": name})
    assert server.batcher.version == 0
    assert all(torch.equal(before[k], v) for k, v in served(server).items())


def test_weights_of_another_model_are_refused_whole(server):
    before = served(server)
    wrong = moved(server.sampler.model)
    wrong["model.norm.weight"] = torch.ones(3)
    name = transfer(server, weights_payload(wrong), version=1)
    with pytest.raises(RequestError, match=r"model.norm.weight \(3,\)"):
        server.commit_transfer({"transfer": name})
    assert server.batcher.version == 0
    assert all(torch.equal(before[k], v) for k, v in served(server).items()), "no tensor copied"


def test_the_swap_waits_for_the_sampler_call_in_progress(server):
    before = served(server)
    new = moved(server.sampler.model)
    name = transfer(server, weights_payload(new), version=1)
    replies = []
    with server.batcher.lock:  # what a sampler call holds while it generates
        committing = threading.Thread(target=lambda: replies.append(server.commit_transfer({"transfer": name})))
        committing.start()
        committing.join(timeout=1.0)
        assert committing.is_alive(), "the swap waits for the call"
        assert server.batcher.version == 0
        assert all(torch.equal(before[k], v) for k, v in served(server).items()), "not a tensor changed mid-call"
    committing.join(timeout=30)
    assert replies and replies[0]["policy_version"] == 1
    assert all(torch.equal(new[k], v) for k, v in served(server).items())


@pytest.mark.parametrize("server", [{"reload": "vllm"}, {"launch": "vllm"}])
def test_http_transfer_to_a_vllm_server_is_a_config_error_that_says_why(server):
    from tempering.config import ConfigError, load_config

    overrides = [f"rollout.server.{key}={value}" for key, value in
                 {"url": "http://127.0.0.1:8000", "weight_transfer": "http", **server}.items()]
    with pytest.raises(ConfigError, match=r"weight_transfer: http .* needs CUDA: set weight_transfer: disk"):
        load_config(None, overrides)
