"""How the server-backed generator reads a server's errors and vLLM's reload endpoints, against a
scripted HTTP server on 127.0.0.1 (the real vLLM is in tests/integration/test_vllm_server.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tempering.rollout.remote import ServerError, ServerGenerator, ServerSettings

MODELS = {"data": [{"id": "m", "max_model_len": 64}]}


class Scripted(ThreadingHTTPServer):
    """Answers each path with a fixed ``(status, JSON body)``; records the requests it gets."""

    daemon_threads = True

    def __init__(self, replies: dict[str, tuple[int, dict]]):
        self.replies, self.requests = replies, []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass

    def _answer(self, body):
        self.server.requests.append((self.command, self.path, body))
        status, payload = self.server.replies.get(self.path.split("?")[0], (404, {"error": "no such path"}))
        if callable(payload):
            payload = payload(body)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer(None)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self._answer(json.loads(self.rfile.read(length)) if length else None)


@pytest.fixture
def scripted():
    servers = []

    def start(replies):
        server = Scripted(replies)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()


class Tokenizer:
    chat_template = None

    def save_pretrained(self, folder):
        pass


def test_a_5xx_answer_is_quoted_not_taken_for_a_missing_server(scripted):
    server = scripted({"/v1/models": (500, {"error": {"message": "Field '_hf_config_revision' not found in ModelConfig",
                                                      "type": "InternalServerError", "code": 500}})})
    with pytest.raises(ServerError) as caught:
        ServerGenerator(ServerSettings(server.url, retries=1, backoff_s=0.0), Tokenizer())
    message = str(caught.value)
    assert "status 500: Field '_hf_config_revision' not found in ModelConfig" in message
    assert "is the server running" not in message
    assert len(server.requests) == 2, "a 5xx is still retried"


def vllm_like(state: dict) -> dict:
    """The development endpoints of vLLM 0.32 that a reload uses, over ``state``."""

    def set_version(body):
        state["version"] = body["new_version"]
        return {"success": True, "new_version": body["new_version"]}

    return {"/v1/models": (200, MODELS), "/weight_info": (200, lambda _: {"weight_version": state["version"]}),
            "/collective_rpc": (200, {"results": [None]}), "/reset_prefix_cache": (200, {"success": True}),
            "/update_weight_version": (200, set_version)}


def test_a_vllm_reload_loads_the_folder_resets_the_prefix_cache_and_moves_the_version(scripted, tmp_path):
    state = {"version": "default"}
    server = scripted(vllm_like(state))
    generator = ServerGenerator(ServerSettings(server.url, weights_dir=str(tmp_path), reload="vllm"), Tokenizer())
    for _ in range(2):
        generator.load_weights({"w": torch.ones(2)})
    posts = [(path, body) for method, path, body in server.requests if method == "POST"]
    reload = ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}})
    assert posts == [reload, ("/reset_prefix_cache", None), ("/update_weight_version", {"new_version": "1"}),
                     reload, ("/reset_prefix_cache", None), ("/update_weight_version", {"new_version": "2"})]
    assert generator.served_version == 2 and state["version"] == "2"
    assert (tmp_path / "model.safetensors").is_file()


def test_a_vllm_server_whose_weights_another_client_changed_stops_the_run(scripted, tmp_path):
    state = {"version": "default"}
    server = scripted(vllm_like(state))
    generator = ServerGenerator(ServerSettings(server.url, weights_dir=str(tmp_path), reload="vllm"), Tokenizer())
    generator.load_weights({"w": torch.ones(2)})
    state["version"] = "7"
    with pytest.raises(ServerError, match="is at weight version 7, not 1 as this run left it: another client"):
        generator.load_weights({"w": torch.ones(2)})


def test_a_prefix_cache_that_cannot_be_reset_is_an_error(scripted, tmp_path):
    state = {"version": "default"}
    replies = {**vllm_like(state), "/reset_prefix_cache": (200, {"success": False})}
    generator = ServerGenerator(ServerSettings(scripted(replies).url, weights_dir=str(tmp_path), reload="vllm"),
                                Tokenizer())
    with pytest.raises(ServerError, match="could not reset its prefix cache"):
        generator.load_weights({"w": torch.ones(2)})


def test_every_vllm_server_of_a_list_gets_each_reload_and_version(scripted, tmp_path):
    states = [{"version": "default"}, {"version": "default"}]
    servers = [scripted(vllm_like(state)) for state in states]
    generator = ServerGenerator(ServerSettings(tuple(s.url for s in servers), weights_dir=str(tmp_path),
                                               reload="vllm"), Tokenizer())
    generator.load_weights({"w": torch.ones(2)})
    for server in servers:
        assert [path for method, path, _ in server.requests if method == "POST"] == [
            "/collective_rpc", "/reset_prefix_cache", "/update_weight_version"]
    assert generator.served_version == 1 and [state["version"] for state in states] == ["1", "1"]
    states[1]["version"] = "5"
    with pytest.raises(ServerError, match=f"{servers[1].url} is at weight version 5, not 1"):
        generator.load_weights({"w": torch.ones(2)})


def test_vllm_servers_at_different_weight_versions_are_refused(scripted, tmp_path):
    servers = [scripted(vllm_like({"version": version})) for version in ("1", "2")]
    with pytest.raises(ServerError, match="the servers are at different weight versions"):
        ServerGenerator(ServerSettings(tuple(s.url for s in servers), reload="vllm"), Tokenizer())


def test_every_vllm_server_of_a_list_gets_each_adapter_and_its_folder_goes_after_all_unloaded_it(scripted, tmp_path):
    folder_there = []  # at each unload request: whether the adapter's folder still exists

    def unload(body):
        folder_there.append((tmp_path / f"adapter-{body['lora_name'].rsplit('-', 1)[1]}").is_dir())
        return {"success": True}

    states = [{"version": "default"}, {"version": "default"}]
    servers = [scripted({**vllm_like(state), "/v1/load_lora_adapter": (200, {"success": True}),
                         "/v1/unload_lora_adapter": (200, unload)}) for state in states]
    generator = ServerGenerator(ServerSettings(tuple(s.url for s in servers), reload="vllm"), Tokenizer())
    for _ in range(2):
        name = generator.vllm.load_adapter(lambda folder: folder.mkdir(), tmp_path, "lora")
    assert name == "lora-2" and [state["version"] for state in states] == ["2", "2"]
    for server in servers:
        assert [(path, (body or {}).get("lora_name")) for method, path, body in server.requests if "lora" in path] == [
            ("/v1/load_lora_adapter", "lora-1"), ("/v1/load_lora_adapter", "lora-2"),
            ("/v1/unload_lora_adapter", "lora-1")]
    assert folder_there == [True, True], "the first adapter's folder stayed until both servers unloaded it"
    assert not (tmp_path / "adapter-1").exists() and (tmp_path / "adapter-2").is_dir()
