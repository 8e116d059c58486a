"""One domain's grader goes away under a real joint ``temper train``: a real ``temper sandbox
serve``, started by these tests on 127.0.0.1, grades only the code task (a dataset of call
tests, ``rewards.options.code.url``); the arithmetic tasks ``add`` and ``sub`` are graded in
the run's own process. While the service is down the code task is paused and the arithmetic
ones keep training; once it is back, a probe re-admits the code task. Per task, every sampled
rollout is trained on, dropped or still buffered, at every step.

The tiny model writes no real programs: its completions are run as they are
(``code_fenced: false``) and fail their tests, which is enough, since what is tested is the
traffic to the grader, not the rewards.

The resume test makes the outage happen at known rounds (``TEMPERING_STOP_AT`` halts the run
at a round's start while the test stops or starts the service), so that a run killed while
the code task is paused and resumed ends exactly where an uninterrupted one ends.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from graders import Temper, records, serve_sandbox, stop
from serving import free_port
from tempering.sandbox import SandboxUnavailable, choose_isolation
from tempering.train import is_timing

CODE, ARITHMETIC = "dataset", ("add", "sub")


@pytest.fixture(scope="module")
def isolation():
    try:
        return choose_isolation("auto")
    except SandboxUnavailable as err:
        pytest.skip(f"no sandbox isolation on this machine: {err}")


@pytest.fixture
def port(isolation):
    return free_port()


@pytest.fixture
def joint_config(tmp_path: Path, tiny_model_dir: Path):
    """A config that trains the tiny model on add, sub and a code dataset graded at ``url``."""
    def write(url: str, steps: int, **checkpoint) -> Path:
        rows = [{"prompt": f"Write f(x) returning x + {k}.", "code_fenced": False,
                 "tests": {"kind": "call", "entry_point": "f", "cases": [{"args": [1], "expected": 1 + k}]}}
                for k in range(12)]
        train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
        train.write_text("".join(json.dumps(r) + "\n" for r in rows[:10]))
        held_out.write_text("".join(json.dumps(r) + "\n" for r in rows[10:]))
        config = {
            "threads": 1, "steps": steps, "model": {"path": str(tiny_model_dir)},
            "tasks": [{"name": "add", "options": {"digits": [1]}}, {"name": "sub", "options": {"digits": [1]}},
                      {"name": "dataset", "options": {"path": str(train), "eval_path": str(held_out), "kind": "code"}}],
            "rollout": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 8},
            "eval": {"problems_per_task": 2, "max_new_tokens": 8},
            "scheduler": {"probe_rounds": 1, "max_probe_rounds": 2},
            "rewards": {"options": {"code": {"url": url, "timeout_s": 2.0}}},
            "checkpoint": {"every": 0, **checkpoint},
        }
        path = tmp_path / "config.yaml"
        path.write_text(json.dumps(config))
        return path
    return write


def _balanced(record: dict) -> bool:
    """sampled = trained + dropped + buffered for every task of a step record."""
    return all(record[f"domain/{name}/rollouts_sampled"] == sum(
        record[f"domain/{name}/rollouts_{part}"] for part in ("trained", "dropped", "buffered"))
        for name in (CODE, *ARITHMETIC))


def _paused(record: dict) -> bool:
    return record.get(f"domain/{CODE}/paused") == 1


@pytest.mark.parametrize("outage_s, steps", [(0.0, 300), pytest.param(60.0, 2500, marks=pytest.mark.slow)],
                         ids=["brief", "a-minute"])
def test_a_joint_run_pauses_the_domain_whose_grader_is_down_and_readmits_it(tmp_path, port, joint_config,
                                                                              outage_s, steps):
    config = joint_config(f"http://127.0.0.1:{port}", steps)
    run = tmp_path / "run"
    service = serve_sandbox(port)
    try:
        train = Temper("train", str(config), "--quiet", "--run-dir", str(run))
        train.wait_for(lambda: len(records(run)) >= 3, "three steps were logged")
        stop(service)
        down = time.monotonic()
        train.wait_for(lambda: sum(map(_paused, records(run))) >= 5, "five steps were logged with code paused")
        time.sleep(max(0.0, outage_s - (time.monotonic() - down)))
        service = serve_sandbox(port)
        assert train.finish() == 0, train.stderr[-3000:]
    finally:
        stop(service)

    logged = records(run)
    assert [r["step"] for r in logged] == list(range(1, steps + 1)), "the run never stopped"
    paused = [i for i, r in enumerate(logged) if _paused(r)]
    assert paused and paused == list(range(paused[0], paused[-1] + 1)), "one pause, one re-admission"
    first, last = logged[paused[0]], logged[paused[-1]]
    for name in ARITHMETIC:  # the arithmetic domains trained through the outage
        assert last[f"domain/{name}/rollouts_trained"] > first[f"domain/{name}/rollouts_trained"]
    assert last[f"domain/{CODE}/rollouts_sampled"] == first[f"domain/{CODE}/rollouts_sampled"], \
        "no draws of a paused domain"
    assert first[f"domain/{CODE}/rollouts_dropped"] > 0, "its rollouts in flight were dropped, not scored as wrong"
    assert last[f"domain/{CODE}/weight"] == 0.0
    assert logged[-1][f"domain/{CODE}/rollouts_trained"] > last[f"domain/{CODE}/rollouts_trained"], "re-admitted"
    assert logged[-1][f"domain/{CODE}/pauses"] == 1 and logged[-1]["paused_domains"] == 0
    assert all(r["outage_rounds"] == 0 for r in logged), "a partial outage is not a whole-run one"
    assert all(map(_balanced, logged))
    if outage_s:
        assert sum(r["step_s"] for r in logged[paused[0]:paused[-1] + 1]) >= 0.9 * outage_s, "a minute paused"
    counts = json.loads((run / "summary.json").read_text())["rollouts"]["by_domain"]
    assert all(c["sampled"] == c["trained"] + c["dropped"] + c["buffered"] for c in counts.values()), counts
    assert f"task {CODE} paused: its grader dropped every rollout" in train.stderr
    assert f"task {CODE} re-admitted: its grader answers again" in train.stderr
    assert "Traceback" not in train.stderr


def step_records(run: Path) -> list[dict]:
    """The run's step records without the keys that measure wall-clock time."""
    return [{k: v for k, v in r.items() if not is_timing(k) and k != "checkpoint_s"} for r in records(run)]


def weights(run: Path) -> bytes:
    from safetensors.torch import load_file

    tensors = load_file(run / "checkpoint-final" / "model.safetensors")
    return b"".join(name.encode() + t.numpy().tobytes() for name, t in sorted(tensors.items()))


def _outage(train: Temper, port: int, service, at: list[str]):
    """Run ``train`` through its halts: at each, stop the service ("stop") or start it ("start"),
    then let the run go on; return the service left running (or None)."""
    for action in at:
        train.wait_halted(f"the halt to {action} the service")
        if action == "stop":
            stop(service)
            service = None
        else:
            service = serve_sandbox(port)
        train.go_on()
    return service


def test_a_run_killed_while_a_domain_is_paused_resumes_exactly(tmp_path, port, joint_config):
    """The service is down from round 4 to round 8: the uninterrupted run, and a run killed in its
    7th step (its newest checkpoint, step 6, taken while code is paused) and resumed, halted
    again before its rounds 7 and 9 (the run's own) to stop and start the service."""
    steps, args = 14, ["--quiet"]
    reference, run = tmp_path / "reference", tmp_path / "run"
    config = joint_config(f"http://127.0.0.1:{port}", steps, every=2)
    service = serve_sandbox(port)
    try:
        train = Temper("train", str(config), *args, "--run-dir", str(reference),
                       env={"TEMPERING_STOP_AT": "round:4,round:9"})
        service = _outage(train, port, service, ["stop", "start"])
        assert train.finish() == 0, train.stderr[-3000:]

        killed = Temper("train", str(config), *args, "--run-dir", str(run),
                        env={"TEMPERING_STOP_AT": "round:4", "TEMPERING_KILL_AT": "learn:7"})
        service = _outage(killed, port, service, ["stop"])
        assert killed.finish() == -signal.SIGKILL, killed.stderr[-3000:]
        assert [r["step"] for r in records(run)] == list(range(1, 7))
        assert _paused(records(run)[-1]), "killed while the code task is paused"

        service = serve_sandbox(port)  # a resumed run asks for the service's health at start
        resumed = Temper("train", "--resume", str(run), *args, env={"TEMPERING_STOP_AT": "round:1,round:3"})
        service = _outage(resumed, port, service, ["stop", "start"])
        assert resumed.finish() == 0, resumed.stderr[-3000:]
    finally:
        if service is not None:
            stop(service)

    expected = step_records(reference)
    assert [r["step"] for r in expected if _paused(r)][0] <= 6 < [r["step"] for r in expected if _paused(r)][-1]
    assert not _paused(expected[-1]), "code was re-admitted before the end"
    assert step_records(run) == expected
    assert weights(run) == weights(reference)
