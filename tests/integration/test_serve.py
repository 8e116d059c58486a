"""``temper serve`` and the server-backed generator, over real HTTP on 127.0.0.1.

The server runs in this process on a copy of the miniature model (reloads change its
weights); the generator talks to it exactly as it talks to vLLM. The learner's recomputed
log-probs are compared with what came over the wire, token by token.
"""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch
from safetensors.torch import save_file

from tempering.config import ConfigError, TrainConfig, load_config
from tempering.learner.forward import token_logprobs
from tempering.learner.step import collate
from tempering.models.lora import apply_lora
from tempering.rollout.base import SamplingParams
from tempering.rollout.base import RowStreams
from tempering.rollout.engines import server_generator
from tempering.rollout.hf import HFGenerator
from tempering.rollout.remote import ServerError, ServerGenerator, ServerSettings
from tempering.rollout.server import Limits, start
from tempering.types import Problem
from serving import HangingUp, get, post
from test_envs_tokens import check_bookkeeping, logprob_gap, play

PROMPTS = ["47+38\n", "52-17\n", "47*6\n"]


@pytest.fixture(scope="module")
def served(tiny_policy):
    """``(server, its sampler's model, tokenizer)``: a copy of the miniature model, served."""
    model, tokenizer = tiny_policy
    model = copy.deepcopy(model)
    http = start(HFGenerator(model, tokenizer), "mini", batch_size=64)
    yield http, model, tokenizer
    http.shutdown()


def completion(url: str, prompt_ids: list[int], seed: int, n: int = 4) -> list[tuple]:
    reply = post(url + "/v1/completions", {"prompt": prompt_ids, "n": n, "max_tokens": 16, "seed": seed,
                                           "logprobs": 0, "return_tokens_as_token_ids": True})
    return [(c["token_ids"], c["logprobs"]["token_logprobs"], c["finish_reason"]) for c in reply["choices"]]


def test_a_request_gets_what_the_sampler_draws_with_its_seed_batched_or_not(served):
    http, model, tokenizer = served
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    alone = [completion(http.url, ids, seed) for seed, ids in enumerate(prompts)]
    streams = RowStreams([torch.Generator().manual_seed(j) for j in range(4)], list(range(4)))  # seed + j, as vLLM
    direct = HFGenerator(model, tokenizer).sample([prompts[0]] * 4, SamplingParams(max_new_tokens=16), streams)
    assert [ids for ids, _, _ in alone[0]] == [ids for ids, _, _ in direct]
    assert [x for _, lp, _ in alone[0] for x in lp] == pytest.approx([x for _, lp, _ in direct for x in lp], abs=1e-6)
    together: list = [None] * len(prompts)

    def ask(k):
        together[k] = completion(http.url, prompts[k], k)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [[ids for ids, _, _ in c] for c in together] == [[ids for ids, _, _ in c] for c in alone]


def test_server_rollouts_are_the_learners_tokens_and_log_probs(served):
    http, model, tokenizer = served
    generator = ServerGenerator(ServerSettings(http.url), tokenizer, model.config)
    problems = [Problem(task="add", id=str(i), prompt=p, answer="") for i, p in enumerate(PROMPTS)]
    groups = generator.generate(problems, 4, SamplingParams(max_new_tokens=16), policy_version=7,
                                generator=torch.Generator().manual_seed(0))
    again = generator.generate(problems, 4, SamplingParams(max_new_tokens=16), generator=torch.Generator().manual_seed(0))
    rollouts = [r for g in groups for r in g.rollouts]
    assert [r.completion_ids for r in rollouts] == [r.completion_ids for g in again for r in g.rollouts]
    assert {r.policy_version for r in rollouts} == {7}
    assert all(r.prompt_ids == tokenizer(r.problem.prompt)["input_ids"] for r in rollouts)
    batch = collate(rollouts, tokenizer.pad_token_id)
    with torch.no_grad():
        learner_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT)
    assert float(((learner_BT - batch.old_logprobs_BT) * batch.loss_mask_BT).abs().max()) < 1e-5


def test_reloaded_weights_sample_the_next_version(served, tmp_path):
    http, model, tokenizer = served
    generator = ServerGenerator(ServerSettings(http.url, weights_dir=str(tmp_path)), tokenizer, model.config)
    before = generator.served_version
    learner = copy.deepcopy(model)
    with torch.no_grad():
        learner.lm_head.weight.mul_(1.5)  # sharper: every log-prob changes
    generator.load_weights({k: v.clone() for k, v in learner.state_dict().items()})
    assert generator.served_version == before + 1
    assert post(http.url + "/v1/completions", {"prompt": "1+1\n", "max_tokens": 1})["policy_version"] == before + 1
    rollouts = [r for g in generator.generate([Problem(task="add", id="0", prompt="12+9\n", answer="")], 4,
                                              SamplingParams(max_new_tokens=12)) for r in g.rollouts]
    assert logprob_gap(learner, rollouts, tokenizer.pad_token_id) < 1e-5
    assert torch.equal(model.lm_head.weight, learner.lm_head.weight), "the served copy holds the learner's weights"


def test_multi_turn_episodes_through_the_server_keep_exact_tokens(served):
    http, model, tokenizer = served
    generator = ServerGenerator(ServerSettings(http.url), tokenizer, model.config)
    rollouts = play(generator, PROMPTS, max_new_tokens=24)
    assert sum(len(r.turns) for r in rollouts) > 2 * len(rollouts)
    check_bookkeeping(rollouts, tokenizer)
    assert logprob_gap(model, rollouts, tokenizer.pad_token_id) < 1e-5


def test_a_loaded_lora_adapter_samples_the_learners_log_probs_under_its_name(tiny_policy, tmp_path):
    model, tokenizer = tiny_policy
    http = start(HFGenerator(copy.deepcopy(model), tokenizer), "mini", batch_size=64)  # its own: adapters stay
    try:
        learner = apply_lora(copy.deepcopy(model), rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")
        torch.manual_seed(0)
        with torch.no_grad():
            for name, param in learner.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.2)  # a fresh adapter computes the base; this one does not
        generator = ServerGenerator(ServerSettings(http.url, weights_dir=str(tmp_path)), tokenizer, model.config,
                                    adapted=learner)
        problems = [Problem(task="add", id=str(i), prompt=p, answer="") for i, p in enumerate(PROMPTS)]
        params = SamplingParams(max_new_tokens=12)
        before = [r for g in generator.generate(problems, 2, params) for r in g.rollouts]
        generator.load_weights({k: v.clone() for k, v in learner.state_dict().items()})
        assert generator.served_version == 1 and generator.model == "tempering-lora"
        assert sorted((tmp_path / "adapter").iterdir()) == [tmp_path / "adapter" / "adapter_config.json",
                                                            tmp_path / "adapter" / "adapter_model.safetensors"]
        listed = {m["id"]: m for m in generator._request("GET", "/v1/models", None)["data"]}
        assert listed["tempering-lora"]["parent"] == "mini" and listed["tempering-lora"]["policy_version"] == 1
        after = [r for g in generator.generate(problems, 2, params) for r in g.rollouts]
        pad = tokenizer.pad_token_id
        assert logprob_gap(model, before, pad) < 1e-5
        assert logprob_gap(learner, after, pad) < 1e-5
        assert logprob_gap(model, after, pad) > 1e-2, "the adapter changed the served log-probs"
        base = ServerGenerator(ServerSettings(http.url, model="mini"), tokenizer, model.config)
        assert logprob_gap(model, [r for g in base.generate(problems, 2, params) for r in g.rollouts], pad) < 1e-5
        with pytest.raises(ServerError, match="a LoRA adapter is loaded on this server"):
            base.load_weights({k: v.clone() for k, v in model.state_dict().items()})
    finally:
        http.shutdown()


def test_vllms_adapter_sync_runs_against_temper_serve(tiny_policy, tmp_path):
    """reload: vllm speaks vLLM's endpoints (load, then unload the adapter before; reset the
    prefix cache; set and read the weight version): temper serve answers each as vLLM does."""
    model, tokenizer = tiny_policy
    http = start(HFGenerator(copy.deepcopy(model), tokenizer), "mini", batch_size=64)
    try:
        learner = apply_lora(copy.deepcopy(model), rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")
        generator = ServerGenerator(ServerSettings(http.url, weights_dir=str(tmp_path), reload="vllm"), tokenizer,
                                    model.config, adapted=learner)
        problems = [Problem(task="add", id="0", prompt=PROMPTS[0], answer="")]
        for step in (1, 2):
            with torch.no_grad():
                for name, param in learner.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(step))
            generator.load_weights({k: v.clone() for k, v in learner.state_dict().items()})
            assert generator.model == f"tempering-lora-{step}" and generator.served_version == step
            rollouts = [r for g in generator.generate(problems, 2, SamplingParams(max_new_tokens=8)) for r in g.rollouts]
            assert logprob_gap(learner, rollouts, tokenizer.pad_token_id) < 1e-5
        assert json.loads(urllib.request.urlopen(http.url + "/weight_info").read()) == {"weight_version": "2"}
        generator.close()  # unloads the last adapter
        assert [m["id"] for m in json.loads(urllib.request.urlopen(http.url + "/v1/models").read())["data"]] == ["mini"]
    finally:
        http.shutdown()


def test_a_dropped_request_is_sent_again_and_gets_the_same_tokens(served):
    """One server that hangs up: marked down, probed, back, and the request sent again to it."""
    http, model, tokenizer = served
    proxy = HangingUp(http.url, lambda done: done == 0)
    try:
        direct = ServerGenerator(ServerSettings(http.url), tokenizer, model.config)
        flaky = ServerGenerator(ServerSettings(proxy.url, probe_s=0.01), tokenizer, model.config)
        prompt = [tokenizer("47+38\n")["input_ids"]]
        params = SamplingParams(max_new_tokens=12)
        got = flaky.sample(prompt, params, torch.Generator().manual_seed(3))
        assert proxy.hung_up == 1 and flaky.record()["server/0/returns"] == 1
        assert got == direct.sample(prompt, params, torch.Generator().manual_seed(3))
    finally:
        proxy.shutdown()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"http://127.0.0.1:{port}"


def test_no_server_is_one_message_naming_the_url(tiny_policy):
    model, tokenizer = tiny_policy
    url = closed_port_url()
    with pytest.raises(ServerError, match="no answer after 2 tries"):
        ServerGenerator(ServerSettings(url, retries=1, backoff_s=0.01), tokenizer)
    config = TrainConfig.model_validate({"rollout": {"server": {"url": url, "retries": 0}}})
    with pytest.raises(ConfigError, match=f"rollout.server.url={url}"):
        server_generator(config, model, tokenizer)


def post_status(url: str, body: dict) -> tuple[int, dict]:
    """``(status, JSON body)`` of a POST, error statuses included."""
    try:
        return 200, post(url, body)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_bad_weights_folder_is_a_400_and_leaves_the_served_weights(served, tmp_path):
    http, model, tokenizer = served
    before = completion(http.url, tokenizer("47+38\n")["input_ids"], seed=1)
    garbage, reshaped = tmp_path / "garbage", tmp_path / "reshaped"
    garbage.mkdir()
    (garbage / "model.safetensors").write_bytes(b"not safetensors at all")
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    weights["lm_head.weight"] = weights["lm_head.weight"] * 3  # right shape: would change every answer
    weights["model.norm.weight"] = torch.ones(7)  # wrong shape
    reshaped.mkdir()
    save_file(weights, str(reshaped / "model.safetensors"))
    for folder, reason in [(garbage, "not a readable safetensors file"), (reshaped, "model.norm.weight (7,)"),
                           (tmp_path / "missing", "is not a folder")]:
        status, answer = post_status(http.url + "/update_weights_from_disk", {"model_path": str(folder)})
        assert status == 400, answer
        assert reason in answer["error"]["message"] and answer["error"]["param"] == "model_path"
    assert completion(http.url, tokenizer("47+38\n")["input_ids"], seed=1) == before


def test_a_failed_http_transfer_is_reported_and_leaves_the_served_weights(served, monkeypatch):
    """Over real HTTP: a transfer whose bytes do not match their announced SHA-256 stops the
    sender with the server's words, and the server samples and reports as before it."""
    from tempering.rollout import remote
    from tempering.rollout.weight_transfer import Payload, weights_payload

    http, model, tokenizer = served
    before = completion(http.url, tokenizer("47+38\n")["input_ids"], seed=1)
    version = get(http.url + "/v1/models")["data"][0]["policy_version"]
    weights = {k: v + 0.05 for k, v in model.state_dict().items()}
    good = weights_payload(weights)
    monkeypatch.setattr(remote, "weights_payload", lambda w: Payload("weights", good.data, "0" * 64))
    generator = ServerGenerator(ServerSettings(http.url, weight_transfer="http", chunk_bytes=16 << 10), tokenizer,
                                model.config)
    with pytest.raises(ServerError, match=r"status 400: transfer \w+: the bytes received have SHA-256 .* not 0{64}"):
        generator.load_weights(weights)
    assert get(http.url + "/v1/models")["data"][0]["policy_version"] == version
    assert completion(http.url, tokenizer("47+38\n")["input_ids"], seed=1) == before


def test_a_full_queue_answers_429_until_there_is_room(tiny_policy):
    model, tokenizer = tiny_policy
    http = start(HFGenerator(model, tokenizer), "mini", batch_size=8, limits=Limits(100, 150))
    body = {"prompt": "47+38\n", "max_tokens": 8, "n": 6, "seed": 0}  # 6 rows x (7 + 8) = 90 positions
    try:
        assert post_status(http.url + "/v1/completions", {**body, "n": 7})[0] == 400, "105 positions: over 100"
        first: list = []
        with http.app.batcher.lock:  # the sampler waits: the first request stays queued
            waiting = threading.Thread(target=lambda: first.append(post_status(http.url + "/v1/completions", body)))
            waiting.start()
            while http.app.batcher._queued == 0:
                time.sleep(0.01)
            status, answer = post_status(http.url + "/v1/completions", body)
            assert status == 429 and "--max-queued-tokens" in answer["error"]["message"]
            assert answer["error"]["type"] == "RateLimitError"
        waiting.join()
        assert first[0][0] == 200
        assert post_status(http.url + "/v1/completions", body)[0] == 200, "room again"
    finally:
        http.shutdown()


def test_a_request_larger_than_the_batch_is_sampled_in_batches_the_same_way_every_time(tiny_policy):
    model, tokenizer = tiny_policy
    http = start(HFGenerator(model, tokenizer), "mini", batch_size=4)
    try:
        prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
        reply = post(http.url + "/v1/completions", {"prompt": prompts, "n": 3, "max_tokens": 10, "seed": 8})
        again = post(http.url + "/v1/completions", {"prompt": prompts, "n": 3, "max_tokens": 10, "seed": 8})
        assert len(reply["choices"]) == 9 and [c["token_ids"] for c in reply["choices"]] == [
            c["token_ids"] for c in again["choices"]]
    finally:
        http.shutdown()


def test_requests_are_spread_over_several_servers_and_each_reloads(tiny_policy, tmp_path):
    model, tokenizer = tiny_policy
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.lm_head.weight.mul_(2.0)  # another policy: which server sampled a group shows
    servers = [start(HFGenerator(copy.deepcopy(m), tokenizer), "mini", batch_size=64) for m in (model, other)]
    try:
        urls = tuple(s.url for s in servers)
        problems = [Problem(task="add", id=str(i), prompt=p, answer="") for i, p in enumerate(PROMPTS)]
        params = SamplingParams(max_new_tokens=12)

        def groups(settings):
            generator = ServerGenerator(settings, tokenizer, model.config)
            return generator, generator.generate(problems, 3, params, generator=torch.Generator().manual_seed(0))

        both, dealt = groups(ServerSettings(urls, weights_dir=str(tmp_path)))
        config = TrainConfig.model_validate({"rollout": {"server": {"url": list(urls)}}})
        assert server_generator(config, model, tokenizer).urls == list(urls)
        alone = [groups(ServerSettings(url))[1] for url in urls]
        # each group is one server's (by load: which one depends on timing), and both took some
        sampled_by = [[i for i in (0, 1) if [r.completion_ids for r in group.rollouts]
                       == [r.completion_ids for r in alone[i][k].rollouts]] for k, group in enumerate(dealt)]
        assert all(len(found) == 1 for found in sampled_by), sampled_by
        assert {found[0] for found in sampled_by} == {0, 1}
        record = both.record()
        assert [record["server/0/requests"], record["server/1/requests"]] == \
            [sum(found == [i] for found in sampled_by) for i in (0, 1)]
        both.load_weights({k: v.clone() for k, v in model.state_dict().items()})
        assert [post(url + "/v1/completions", {"prompt": "1+1\n", "max_tokens": 1})["policy_version"]
                for url in urls] == [1, 1]
        assert torch.equal(servers[1].app.sampler.model.lm_head.weight, model.lm_head.weight)
    finally:
        for server in servers:
            server.shutdown()


def test_the_client_sends_the_api_key_a_server_wants(tiny_policy, monkeypatch):
    model, tokenizer = tiny_policy
    http = start(HFGenerator(model, tokenizer), "mini", batch_size=8, api_key="k3y")
    try:
        monkeypatch.delenv("TEMPER_SERVE_API_KEY", raising=False)
        with pytest.raises(ServerError, match="status 401"):
            ServerGenerator(ServerSettings(http.url), tokenizer)
        keyed = ServerGenerator(ServerSettings(http.url, api_key="k3y"), tokenizer)
        prompt = [tokenizer("47+38\n")["input_ids"]]
        got = keyed.sample(prompt, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(1))
        monkeypatch.setenv("TEMPER_SERVE_API_KEY", "k3y")
        from_env = ServerGenerator(ServerSettings(http.url), tokenizer)
        assert from_env.sample(prompt, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(1)) == got
    finally:
        http.shutdown()


def _send_and_hang_up(address: tuple, body: dict, read_first: bool = False) -> None:
    """POST ``body`` to /v1/completions on a raw socket and close it (after the first bytes of
    the answer with ``read_first``) without reading the answer."""
    data = json.dumps(body).encode()
    with socket.create_connection(address[:2]) as connection:
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        answer = b""
        while read_first and b"data:" not in answer:
            answer += (more := connection.recv(4096))
            assert more, "the server closed the stream before its first token"


def test_requests_whose_clients_hung_up_are_dropped_not_sampled(tiny_policy):
    model, tokenizer = tiny_policy
    http = start(HFGenerator(model, tokenizer), "mini", batch_size=16)
    batcher = http.app.batcher
    try:
        prompt = tokenizer(PROMPTS[0])["input_ids"]
        big = {"prompt": [prompt] * 8, "n": 8, "max_tokens": 100, "ignore_eos": True, "seed": 1}
        for _ in range(20):  # 20 requests of 64 rows x 100 tokens, each closed once sent
            _send_and_hang_up(http.server_address, big)
        _send_and_hang_up(http.server_address, {**big, "stream": True}, read_first=True)
        abandoned = 21 * 64 * 100
        reply = post(http.url + "/v1/completions", {"prompt": prompt, "max_tokens": 4, "seed": 0, "ignore_eos": True})
        assert len(reply["choices"][0]["token_ids"]) == 4
        deadline = time.monotonic() + 30
        while batcher.queued and time.monotonic() < deadline:
            time.sleep(0.05)
        assert batcher.queued == 0, "every dropped job gave back its place in the queue"
        # each job is dropped within a poll of its client leaving: a few steps of one 16-row
        # call at most, against all 134,400 tokens when they were sampled for no one
        assert batcher.tokens_drawn - 4 < abandoned / 20, batcher.tokens_drawn
    finally:
        http.shutdown()


@pytest.mark.parametrize("url", ["not a url", "ftp://127.0.0.1:21", "http://127.0.0.1:99999",
                                 "[http://127.0.0.1:8000, localhost]"])
def test_a_server_url_that_is_not_http_stops_at_the_config(url):
    with pytest.raises(ConfigError, match=r"rollout\.server\.url.*(http:// or https://|valid port)"):
        load_config(None, [f"rollout.server.url={url}"])


def test_temper_train_refuses_a_non_http_server_url_with_exit_2_before_loading_a_model():
    run = subprocess.run([sys.executable, "-m", "tempering.cli", "train", "rollout.server.url=ftp://127.0.0.1:21"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "rollout.server.url='ftp://127.0.0.1:21'" in run.stderr, run.stderr
