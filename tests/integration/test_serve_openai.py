"""The ``openai`` client against a real ``temper serve`` (a subprocess on 127.0.0.1, the
miniature model): what a user's own client sees, held to vLLM's OpenAI server semantics.

Log-probs are checked against the learner's recomputation on the same weights, loaded here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest
import torch

from serving import get, post, serving

PROMPT = "57+46\n7+6=13\n"


@pytest.fixture(scope="module")
def client(mini_server_url):
    return openai.OpenAI(base_url=mini_server_url + "/v1", api_key="unused", max_retries=0)


def model_logprobs(policy, ids: list[int]) -> list[float]:
    """Each token's log-prob given those before it, from the model's own forward pass."""
    model, _ = policy
    with torch.no_grad():
        scores = model(input_ids=torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    return scores.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_a_streamed_completion_is_the_whole_one_in_chunks_with_usage(client):
    whole = client.completions.create(model="mini", prompt=PROMPT, max_tokens=12, seed=5, n=2)
    chunks = list(client.completions.create(model="mini", prompt=PROMPT, max_tokens=12, seed=5, n=2, stream=True,
                                            stream_options={"include_usage": True}))
    assert len(chunks) > 4, "one chunk a token"
    texts = ["", ""]
    for chunk in chunks[:-1]:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == [c.text for c in whole.choices]
    finished = [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason]
    assert finished == [c.finish_reason for c in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_a_streamed_chat_is_the_whole_answer_in_deltas(client):
    messages = [{"role": "user", "content": "57+46"}]
    whole = client.chat.completions.create(model="mini", messages=messages, max_tokens=10, seed=2)
    chunks = list(client.chat.completions.create(model="mini", messages=messages, max_tokens=10, seed=2, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_a_stream_sends_each_token_as_it_is_drawn_and_joins_into_the_unstreamed_answer(client):
    asked = dict(model="mini", prompt=PROMPT, max_tokens=150, seed=3, logprobs=2, extra_body={"ignore_eos": True})
    whole = client.completions.create(**asked).choices[0]
    start = time.monotonic()
    arrivals, text, logprobs = [], "", []
    for chunk in client.completions.create(**asked, stream=True):
        arrivals.append(time.monotonic() - start)
        text += chunk.choices[0].text
        logprobs += chunk.choices[0].logprobs.token_logprobs if chunk.choices[0].logprobs else []
    assert text == whole.text and logprobs == whole.logprobs.token_logprobs
    assert len(arrivals) == 151  # a chunk a token, then the one with the finish reason
    # sent as sampled: the second half of the chunks is spread over the drawing of 75 tokens
    # (sent at the end, all came within a few milliseconds of one another); not a share of the
    # whole, which a slow first token on a busy machine would shrink
    assert arrivals[-1] - arrivals[len(arrivals) // 2] > 0.02, arrivals


@pytest.mark.parametrize("stop", [["=1"], ["\n"], ["+", "3\n"]])
def test_a_streamed_text_stops_where_the_unstreamed_one_does(client, stop):
    for seed in range(4):
        asked = dict(model="mini", prompt=PROMPT, max_tokens=40, seed=seed, stop=stop)
        whole = client.completions.create(**asked).choices[0]
        chunks = list(client.completions.create(**asked, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == whole.text
        assert chunks[-1].choices[0].finish_reason == whole.finish_reason
        assert chunks[-1].choices[0].model_extra["stop_reason"] == whole.model_extra["stop_reason"]
        messages = [{"role": "user", "content": "57+46"}]
        whole = client.chat.completions.create(model="mini", messages=messages, max_tokens=30, seed=seed, stop=stop)
        chunks = client.chat.completions.create(model="mini", messages=messages, max_tokens=30, seed=seed, stop=stop,
                                                stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content


def test_continuous_usage_stats_put_the_choices_usage_in_every_chunk(client):
    chunks = list(client.completions.create(model="mini", prompt=PROMPT, max_tokens=6, seed=1, n=2, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    prompt_tokens = chunks[-1].usage.prompt_tokens
    drawn = [0, 0]
    for chunk in chunks[:-1]:
        choice = chunk.choices[0]
        drawn[choice.index] += len(choice.model_extra["token_ids"])
        assert (chunk.usage.prompt_tokens, chunk.usage.completion_tokens) == (prompt_tokens, drawn[choice.index])
    assert chunks[-1].usage.completion_tokens == sum(drawn)
    plain = list(client.completions.create(model="mini", prompt=PROMPT, max_tokens=6, seed=1, stream=True,
                                           stream_options={"include_usage": False, "continuous_usage_stats": True}))
    assert all(c.usage is None for c in plain)  # as vLLM: only with include_usage


def test_each_prompt_of_a_list_is_sampled_as_it_is_alone_with_the_seed(client):
    prompts = [PROMPT, "12+30\n", "7+6=13\n9+"]
    listed = client.completions.create(model="mini", prompt=prompts, max_tokens=12, n=2, seed=21)
    for k, prompt in enumerate(prompts):
        alone = client.completions.create(model="mini", prompt=prompt, max_tokens=12, n=2, seed=21)
        assert [c.text for c in listed.choices[2 * k : 2 * k + 2]] == [c.text for c in alone.choices]
    # sample j of n draws with seed + j, as vLLM seeds a request's samples
    second = client.completions.create(model="mini", prompt=prompts[1], max_tokens=12, seed=22)
    assert second.choices[0].text == listed.choices[3].text


def test_a_chat_tokens_top_logprobs_entry_is_the_same_number_as_its_logprob(client):
    for temperature in (0.7, 1.0, 0.0):
        reply = client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "57+46"}],
                                               max_tokens=24, seed=4, temperature=temperature, logprobs=True,
                                               top_logprobs=20)
        entries = reply.choices[0].logprobs.content
        found = [(e.logprob, {t.token: t.logprob for t in e.top_logprobs}.get(e.token)) for e in entries]
        assert sum(listed is not None for _, listed in found) >= len(found) // 2
        assert all(listed == logprob for logprob, listed in found if listed is not None), found


def test_n_samples_are_seeded_and_distinct(client):
    first = client.completions.create(model="mini", prompt=PROMPT, max_tokens=8, n=6, seed=11)
    again = client.completions.create(model="mini", prompt=PROMPT, max_tokens=8, n=6, seed=11)
    assert [c.index for c in first.choices] == list(range(6))
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1


def test_a_stop_string_is_cut_from_the_text_but_not_from_the_token_ids(client, tiny_policy):
    _, tokenizer = tiny_policy
    prompt = "57+46\n7+6=13\n5+4=9\n"  # the miniature model goes on with "answer: ..."
    cut = client.completions.create(model="mini", prompt=prompt, max_tokens=12, temperature=0, stop=[":"])
    kept = client.completions.create(model="mini", prompt=prompt, max_tokens=12, temperature=0, stop=[":"],
                                     extra_body={"include_stop_str_in_output": True})
    choice = cut.choices[0]
    sampled = tokenizer.decode(choice.model_extra["token_ids"], skip_special_tokens=True)
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == ":"
    assert choice.text == "answer" and sampled == "answer:"
    assert kept.choices[0].text == "answer:"
    assert kept.choices[0].model_extra["token_ids"] == choice.model_extra["token_ids"]


def test_logprobs_carry_the_top_alternatives_under_the_sampled_distribution(client, tiny_policy):
    model, tokenizer = tiny_policy
    reply = client.completions.create(model="mini", prompt=PROMPT, max_tokens=6, seed=3, logprobs=3,
                                      extra_body={"return_tokens_as_token_ids": True})
    details = reply.choices[0].logprobs
    ids = tokenizer(PROMPT)["input_ids"] + reply.choices[0].model_extra["token_ids"]
    with torch.no_grad():
        scores = model(input_ids=torch.tensor([ids])).logits[0, len(ids) - 7 : -1].float().log_softmax(-1)
    assert len(details.tokens) == len(details.top_logprobs) == 6
    for position, (token, logprob, top) in enumerate(zip(details.tokens, details.token_logprobs, details.top_logprobs)):
        assert top[token] == logprob, "the sampled token is in its own entry"
        best = scores[position].topk(3)
        alternatives = {f"token_id:{i}": v for i, v in zip(best.indices.tolist(), best.values.tolist())}
        assert set(alternatives) <= set(top) and len(top) in (3, 4)
        assert [top[k] for k in alternatives] == pytest.approx(list(alternatives.values()), abs=1e-5)
    chat = client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "57+46"}],
                                          max_tokens=5, seed=3, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == len(chat.choices[0].model_extra["token_ids"])
    assert all(len(entry.top_logprobs) == 2 for entry in content)
    assert all(entry.top_logprobs[0].logprob >= entry.logprob - 1e-6 for entry in content)
    bare = client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "57+46"}],
                                          max_tokens=5, seed=3, logprobs=True)
    assert [entry.logprob for entry in bare.choices[0].logprobs.content] == [entry.logprob for entry in content]
    assert all(entry.top_logprobs == [] for entry in bare.choices[0].logprobs.content)


def test_echo_with_max_tokens_0_gives_the_prompts_log_probs(client, tiny_policy, mini_server_url):
    _, tokenizer = tiny_policy
    reply = client.completions.create(model="mini", prompt=[PROMPT, "12*3\n"], max_tokens=0, echo=True, logprobs=1)
    assert [c.text for c in reply.choices] == [PROMPT, "12*3\n"]
    for choice, text in zip(reply.choices, [PROMPT, "12*3\n"]):
        ids = tokenizer(text)["input_ids"]
        details = choice.logprobs
        assert details.token_logprobs[0] is None and details.top_logprobs[0] is None
        assert details.token_logprobs[1:] == pytest.approx(model_logprobs(tiny_policy, ids), abs=1e-5)
        assert all(len(top) in (1, 2) for top in details.top_logprobs[1:])
    with_one = post(mini_server_url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "echo": True, "logprobs": 0,
                                                     "temperature": 0})["choices"][0]
    assert with_one["text"].startswith(PROMPT) and len(with_one["logprobs"]["tokens"]) == len(tokenizer(PROMPT)["input_ids"]) + 1


def test_content_parts_and_a_tool_call_turn_are_read_as_text(client, mini_server_url):
    plain = [{"role": "user", "content": "57+46\n7+6=13"}, {"role": "assistant", "content": ""},
             {"role": "tool", "content": "13", "tool_call_id": "c1"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "57+46"}, {"type": "text", "text": "7+6=13"}]},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 7, \"b\": 6}"}}]},
             {"role": "tool", "content": "13", "tool_call_id": "c1"}]
    assert post(mini_server_url + "/tokenize", {"messages": parts})["tokens"] == post(mini_server_url + "/tokenize",
                                                                                 {"messages": plain})["tokens"]
    one = client.chat.completions.create(model="mini", messages=parts, max_tokens=6, seed=4)
    other = client.chat.completions.create(model="mini", messages=plain, max_tokens=6, seed=4)
    assert one.choices[0].message.content == other.choices[0].message.content


def test_sampling_parameters_are_applied(client, tiny_policy):
    _, tokenizer = tiny_policy
    plus = tokenizer.convert_tokens_to_ids("+")
    biased = client.completions.create(model="mini", prompt=PROMPT, max_tokens=5, seed=1, logit_bias={str(plus): 100},
                                       extra_body={"return_tokens_as_token_ids": True})
    assert biased.choices[0].model_extra["token_ids"] == [plus] * 5
    greedy = client.completions.create(model="mini", prompt=PROMPT, max_tokens=8, temperature=0)
    top_1 = client.completions.create(model="mini", prompt=PROMPT, max_tokens=8, seed=9, extra_body={"top_k": 1})
    assert top_1.choices[0].text == greedy.choices[0].text
    repeated = client.completions.create(model="mini", prompt=PROMPT, max_tokens=12, temperature=0,
                                         frequency_penalty=2.0, presence_penalty=2.0)
    ids = repeated.choices[0].model_extra["token_ids"]
    assert len(set(ids)) > len(set(greedy.choices[0].model_extra["token_ids"]))
    long = client.completions.create(model="mini", prompt=PROMPT, max_tokens=20, seed=1,
                                     logit_bias={str(tokenizer.eos_token_id): 100}, extra_body={"min_tokens": 7})
    ids = long.choices[0].model_extra["token_ids"]  # 7 tokens, then the end-of-sequence one may come
    assert len(ids) == 8 and ids[-1] == tokenizer.eos_token_id and long.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("extra, param", [
    ({"suffix": "done"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"logprobs": 21}, "logprobs"),
    ({"extra_body": {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}},
     "response_format"),
    ({"extra_body": {"use_beam_search": True}}, "use_beam_search"),
    ({"logit_bias": {"100000": 5}}, "logit_bias"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"extra_body": {"logprob_token_ids": [5, 6]}, "logprobs": 1}, "logprob_token_ids"),
    ({"extra_body": {"repetition_detection": {"max_pattern_size": 4, "min_count": 3}}}, "repetition_detection"),
    ({"extra_body": {"priority": 1}}, "priority"),
])
def test_what_cannot_be_honoured_is_a_bad_request_naming_it(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="mini", prompt=PROMPT, max_tokens=4, **extra)
    assert caught.value.status_code == 400 and param in caught.value.message
    assert caught.value.body["param"] == param and caught.value.body["type"] == "BadRequestError"


def test_errors_raise_the_clients_own_exceptions(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="mini", prompt=PROMPT, max_tokens=100000)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "1"}], top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="only text parts"):
        client.chat.completions.create(model="mini", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}])


def test_a_request_over_the_token_limit_is_refused_naming_the_option(client):
    with pytest.raises(openai.BadRequestError, match="--max-request-tokens"):
        client.completions.create(model="mini", prompt=[PROMPT] * 2000, n=1000, max_tokens=16)


def test_the_vllm_endpoints_its_clients_call_answer_as_vllm_or_say_what_is_not_supported(mini_server_url):
    url = mini_server_url
    assert get(url + "/version")["version"]
    request = urllib.request.Request(url + "/reset_prefix_cache?reset_external=true", method="POST")  # no body
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert json.loads(reply.read()) == {"success": True}
    version = int(get(url + "/weight_info")["weight_version"])
    assert post(url + "/update_weight_version", {"new_version": str(version + 5)})["success"]
    assert get(url + "/weight_info") == {"weight_version": str(version + 5)}
    assert get(url + "/v1/models")["data"][0]["policy_version"] == version + 5
    post(url + "/update_weight_version", {"new_version": str(version)})
    for bad in ({"new_version": "v2"}, {}):
        with pytest.raises(urllib.error.HTTPError) as caught:
            post(url + "/update_weight_version", bad)
        assert caught.value.code == 400 and json.loads(caught.value.read())["error"]["param"] == "new_version"
    with pytest.raises(urllib.error.HTTPError) as caught:
        post(url + "/v1/unload_lora_adapter", {"lora_name": "nothing-loaded"})
    error = json.loads(caught.value.read())["error"]
    assert caught.value.code == 404 and error["param"] == "lora_name" and "no adapter is loaded" in error["message"]
    for path, body in [("/init_weight_transfer_engine", {"init_info": {"backend": "nccl"}}),
                       ("/start_weight_update", None), ("/update_weights", {"update_info": {"names": ["w"]}}),
                       ("/finish_weight_update", {"weight_version": "2"}), ("/collective_rpc", {"method": "x"})]:
        with pytest.raises(urllib.error.HTTPError) as caught:
            post(url + path, body)
        message = json.loads(caught.value.read())["error"]["message"]
        assert caught.value.code == 501 and path in message and "/update_weights_from_disk" in message
    with pytest.raises(urllib.error.HTTPError) as caught:
        get(url + "/is_paused")
    assert caught.value.code == 501


def test_tokenize_and_detokenize_round_trip(mini_server_url, tiny_policy):
    _, tokenizer = tiny_policy
    tokens = post(mini_server_url + "/tokenize", {"model": "mini", "prompt": PROMPT})
    assert tokens["tokens"] == tokenizer(PROMPT)["input_ids"] and tokens["count"] == len(tokens["tokens"])
    assert tokens["max_model_len"] > 0
    bare = post(mini_server_url + "/tokenize", {"prompt": PROMPT, "add_special_tokens": False})["tokens"]
    assert bare == tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert post(mini_server_url + "/detokenize", {"model": "mini", "tokens": bare}) == {"prompt": PROMPT}
    with urllib.request.urlopen(mini_server_url + "/tokenizer_info", timeout=30) as reply:
        assert json.loads(reply.read())["eos_token"] == tokenizer.eos_token


@pytest.mark.parametrize("options, message", [
    (["--host", "0.0.0.0"], "--host 0.0.0.0: off a loopback address temper serve wants an API key"),
    (["--port", "99999"], "--port 99999: a port is 0..65535"),
    (["--max-request-tokens", "0"], "--max-request-tokens 0 --max-queued-tokens 2097152: each must be at least 1"),
    (["--max-request-tokens", "5000", "--max-queued-tokens", "4000"], "no more than the queue's"),
])
def test_bad_serve_options_exit_2_naming_them(tiny_model_dir, options, message):
    env = {**{k: v for k, v in os.environ.items() if k != "TEMPER_SERVE_API_KEY"}, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tempering.cli", "serve", str(tiny_model_dir), *options],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_off_loopback_the_api_key_is_required_of_every_request(tiny_model_dir, tempering_cache):
    with serving(tiny_model_dir, tempering_cache, "--host", "0.0.0.0", "--api-key", "s3cret") as url:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        with pytest.raises(urllib.error.HTTPError) as caught:
            post(url + "/update_weights_from_disk", {"model_path": "/"})
        assert caught.value.code == 401
        keyed = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert keyed.completions.create(model=keyed.models.list().data[0].id, prompt=PROMPT, max_tokens=3).choices
        with urllib.request.urlopen(url + "/health", timeout=30) as reply:
            assert json.loads(reply.read())["status"] == "ok"


def test_it_listens_on_the_ipv6_loopback(tiny_model_dir, tempering_cache, ipv6_loopback):
    with serving(tiny_model_dir, tempering_cache, "--host", ipv6_loopback) as url:
        assert url.startswith("http://[::1]:")
        ipv6 = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert ipv6.completions.create(model=ipv6.models.list().data[0].id, prompt=PROMPT, max_tokens=3).choices
