"""Servers that fail over, over real HTTP on 127.0.0.1.

First, in this process: a server in front of which a gate hangs up on completions (a server
that stops answering in the middle of a round) and opens again later; the requests it drops
are sent to the other server with their seeds, and draw the tokens they would have drawn
there first; the server is probed and comes back. With no server answering, sampling stops
after ``down_timeout_s`` with one error naming each.

Then the acceptance run (slow): two `temper serve` servers, a `temper train` against both,
one server SIGKILLed mid-run and started again on its port: the run finishes, every rollout sampled is counted once
(sampled = trained + dropped + buffered, and exactly a round's worth per step), each server up
has its policy version checked at every step and at the run's version, and the killed one is
marked down, probed, reloaded with the run's weights and back in service.

The training process is stopped (SIGSTOP) while the killed server starts again, so that the
run cannot end before the server is back, however slow this machine is; the run has noticed
the kill by then (a step's record says the server is down). Everything is real: the CLI, the
servers, the kill."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from serving import HangingUp, free_port, get, perturbed, post
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.rollout.remote import ServerError, ServerGenerator, ServerSettings
from tempering.rollout.server import start
from tempering.types import Problem

PROMPTS, GROUP, STEPS = 4, 4, 24


def test_requests_a_server_drops_go_to_the_other_with_their_seeds_and_it_comes_back(tiny_policy):
    model, tokenizer = tiny_policy
    http = start(HFGenerator(copy.deepcopy(model), tokenizer), "mini", batch_size=64)
    gate = HangingUp(http.url)
    try:
        problems = [Problem(task="add", id=str(k), prompt=f"{k}+{k + 3}\n", answer="") for k in range(6)]
        params = SamplingParams(max_new_tokens=8)
        alone = ServerGenerator(ServerSettings(http.url), tokenizer, model.config)
        both = ServerGenerator(ServerSettings((gate.url, http.url), probe_s=0.05, max_probe_s=0.2), tokenizer,
                               model.config)
        expected = alone.generate(problems, 2, params, 0, torch.Generator().manual_seed(5))

        gate.hang_up = lambda done: True  # after the round's version check: its requests find the server gone
        both.check_servers()
        both.check_servers = lambda: None  # the round below starts with the server up, as one killed mid-round
        got = both.generate(problems, 2, params, 0, torch.Generator().manual_seed(5))

        assert [[r.completion_ids for r in g.rollouts] for g in got] == \
            [[r.completion_ids for r in g.rollouts] for g in expected]
        # the same tokens; log-probs to float32 summation order (the server batches requests as they come)
        assert [x for g in got for r in g.rollouts for x in r.logprobs] == \
            pytest.approx([x for g in expected for r in g.rollouts for x in r.logprobs], abs=1e-5)
        record = both.record()
        assert gate.hung_up >= 1 and record["server/resent"] == gate.hung_up, "each dropped request sent again once"
        assert record["server/0/up"] == 0 and record["server/0/downs"] == 1
        assert record["server/0/requests"] + record["server/1/requests"] == len(problems)

        gate.hang_up = lambda done: False  # the server answers again: probed at the next round and back in service
        del both.check_servers
        time.sleep(0.1)
        both.generate(problems, 2, params, 0, torch.Generator().manual_seed(6))
        record = both.record()
        assert record["server/0/up"] == 1 and record["server/0/returns"] == 1
        assert record["server/0/requests"] >= 1 and record["server/0/checks"] >= 2
    finally:
        gate.shutdown()
        http.shutdown()


def test_no_server_answering_for_down_timeout_s_is_one_error_naming_each(tiny_policy):
    model, tokenizer = tiny_policy
    http = start(HFGenerator(copy.deepcopy(model), tokenizer), "mini", batch_size=8)
    gate = HangingUp(http.url)
    try:
        generator = ServerGenerator(ServerSettings((gate.url, http.url), probe_s=0.05, max_probe_s=0.1,
                                                   down_timeout_s=0.5, timeout_s=2), tokenizer, model.config)
        gate.hang_up = lambda done: True
        http.shutdown()
        http.server_close()  # nothing listens there now: connections are refused
        problems = [Problem(task="add", id="0", prompt="1+1\n", answer="")]
        started = time.monotonic()
        with pytest.raises(ServerError, match=r"no server has answered for \d+ s \(rollout.server.down_timeout_s=0.5\)"
                           ) as raised:
            generator.generate(problems, 2, SamplingParams(max_new_tokens=4), 0, torch.Generator().manual_seed(0))
        assert time.monotonic() - started < 10
        assert gate.url in str(raised.value) and http.url in str(raised.value), "each server and its last error"
    finally:
        gate.shutdown()


def test_a_restarted_server_gets_the_run_s_weights_over_http(tiny_policy):
    """With weight_transfer http, a server that comes back (here a fresh one on the port of one
    shut down, at its starting weights) is sent the run's last weights in chunks before it takes
    a request, and then samples as the server that stayed up."""
    model, tokenizer = tiny_policy
    port = free_port()
    stays = start(HFGenerator(copy.deepcopy(model), tokenizer), "mini", batch_size=8)
    goes = start(HFGenerator(copy.deepcopy(model), tokenizer), "mini", batch_size=8, port=port)
    generator = ServerGenerator(ServerSettings((stays.url, goes.url), probe_s=0.05, max_probe_s=0.1, timeout_s=10,
                                               weight_transfer="http", chunk_bytes=64 << 10), tokenizer, model.config)
    back = None

    def weights(seed: int) -> dict:  # as the learner publishes them: each tensor its own copy
        return {k: v.clone() for k, v in perturbed(model, seed).state_dict().items()}

    try:
        generator.load_weights(weights(1))
        goes.shutdown()
        goes.server_close()
        generator.load_weights(weights(2))  # the one shut down misses these
        assert generator.record()["server/1/up"] == 0 and get(stays.url + "/v1/models")["data"][0]["policy_version"] == 2
        back = start(HFGenerator(copy.deepcopy(model), tokenizer), "mini", batch_size=8, port=port)
        assert get(back.url + "/v1/models")["data"][0]["policy_version"] == 0
        body = {"prompt": ["12+34\n", "57+68\n", "9+9\n"], "max_tokens": 10, "temperature": 0.0}

        def answers(url: str) -> list:
            return [c["token_ids"] for c in post(url + "/v1/completions", body)["choices"]]

        starting = answers(back.url)
        time.sleep(0.1)
        generator.check_servers()
        record = generator.record()
        assert record["server/1/up"] == 1 and record["server/1/returns"] == 1
        assert get(back.url + "/v1/models")["data"][0]["policy_version"] == 2
        assert answers(back.url) == answers(stays.url) != starting
    finally:
        generator.close()
        for http in (stays, back):
            if http is not None:
                http.shutdown()


def start_server(tiny_model_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "tempering.cli", "serve", str(tiny_model_dir), "threads=1",
                             "--port", str(port), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True)


def wait_serving(process: subprocess.Popen) -> None:
    line = process.stdout.readline()
    assert " at http://" in line, process.stderr.read()


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}"
        time.sleep(0.05)


@pytest.mark.slow  # about 3 minutes on a shared, loaded 2-core machine: three server starts and a training run
def test_a_server_killed_mid_run_fails_over_and_comes_back(tiny_model_dir, tempering_cache, tmp_path):
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    servers = [start_server(tiny_model_dir, port) for port in ports]
    run = tmp_path / "run"
    trainer = None
    try:
        for server in servers:
            wait_serving(server)
        trainer = subprocess.Popen(
            [sys.executable, "-m", "tempering.cli", "train", "--quiet", "--run-dir", str(run),
             f"model.path={tiny_model_dir}", f"steps={STEPS}", "threads=1", f"rollout.prompts_per_step={PROMPTS}",
             f"rollout.group_size={GROUP}", "rollout.max_new_tokens=12", "eval.problems_per_task=2",
             "eval.max_new_tokens=8", "checkpoint.every=0", f"rollout.server.url=[{urls[0]},{urls[1]}]",
             "rollout.server.probe_s=0.1", "rollout.server.max_probe_s=0.5", "rollout.server.timeout_s=30",
             "rollout.server.down_timeout_s=60"],
            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: len(records(run)) >= 3 or trainer.poll() is not None, "three steps")
        servers[1].send_signal(signal.SIGKILL)
        servers[1].wait(timeout=30)
        wait_for(lambda: any(r.get("server/1/up") == 0 for r in records(run)) or trainer.poll() is not None,
                 "a step that found the server down")
        trainer.send_signal(signal.SIGSTOP)
        servers[1] = start_server(tiny_model_dir, ports[1])
        wait_serving(servers[1])
        killed_at = len(records(run))
        trainer.send_signal(signal.SIGCONT)
        _, err = trainer.communicate(timeout=300)
        assert trainer.returncode == 0, err[-3000:]
        restarted_version = get(urls[1] + "/v1/models")["data"][0]["policy_version"]
    finally:
        if trainer is not None and trainer.poll() is None:
            trainer.kill()
        for server in servers:
            server.kill()
            server.wait(timeout=30)

    steps = records(run)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    # no rollout lost or counted twice: one round of PROMPTS x GROUP per step, each kept or dropped once
    assert [r["rollouts_sampled"] for r in steps] == [PROMPTS * GROUP * (i + 1) for i in range(STEPS)]
    summary = json.loads((run / "summary.json").read_text())
    for task, counts in summary["rollouts"]["by_domain"].items():
        assert counts["sampled"] == counts["trained"] + counts["dropped"] + counts["buffered"], (task, counts)
    assert sum(c["sampled"] for c in summary["rollouts"]["by_domain"].values()) == PROMPTS * GROUP * STEPS

    # every request answered once: a round's PROMPTS requests per step, by one server or the other
    last = steps[-1]
    assert last["server/0/requests"] + last["server/1/requests"] == PROMPTS * STEPS

    # each server up had its policy version asked at every step (and once at the start), and it was the run's
    assert [r["server/0/checks"] for r in steps] == [i + 2 for i in range(STEPS)]
    for before, record in zip([{"server/1/checks": 1}, *steps], steps):
        assert record["server/0/up"] == 1 and record["server/0/version"] == record["server/expected_version"]
        if record["server/1/up"]:
            assert record["server/1/checks"] == before["server/1/checks"] + 1, record["step"]
            assert record["server/1/version"] == record["server/expected_version"], record["step"]

    # the killed server: down for a stretch of steps, then back at the run's weights, taking requests again
    down = [r["step"] for r in steps if not r["server/1/up"]]
    assert down == list(range(down[0], down[-1] + 1)) and down[-1] < STEPS, down
    assert last["server/1/downs"] == 1 and last["server/1/returns"] == 1 and last["server/1/up"] == 1
    back = steps[down[-1]]  # the first step after its return
    assert last["server/1/requests"] > back["server/1/requests"], "it served requests after coming back"
    assert restarted_version == last["server/expected_version"] + 1, "and it took the final weights too"
