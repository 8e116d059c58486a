"""A two-node Ray cluster on this machine: two ``ray start`` processes, the head offering the
custom resource ``learner``, the other ``rollout``. A real ``temper train`` process (the driver)
joins it, with the learner on the first node and the rollout and reward workers on the second
(``pipeline.learner=ray`` and the ``*_resources`` fields); its numbers are a local run's.
Then the rollout node is stopped in the middle of a run: the run fails with a message saying how
to continue, the node is started again, and ``temper train --resume`` ends with the weights of
the uninterrupted run.

Every Ray process the test starts is stopped by its fixtures (SIGTERM to each ``ray start
--block`` process, which drains its node and stops what it started; SIGKILL to its process
group if that is not done within a minute).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from serving import free_port
from test_resume import step_records, weights

from tempering.config import load_config

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

ARGS = ["steps=6", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24",
        "eval.problems_per_task=6", "eval.max_new_tokens=24", "checkpoint.every=2"]

NODE_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
            # a shared test machine's other processes must not make Ray kill this test's workers
            "RAY_memory_monitor_refresh_ms": "0"}


class RayNode:
    """One node: a ``ray start --block`` process with its own ports and custom resource."""

    def __init__(self, log: Path, resource: str, head_port: int, head: bool):
        ports = {flag: free_port() for flag in ("--node-manager-port", "--object-manager-port",
                                                 "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                                 "--runtime-env-agent-port", "--metrics-export-port")}
        if head:
            ports.update({"--port": head_port, "--ray-client-server-port": free_port(),
                          "--dashboard-port": free_port()})
            self.temp_dir = tempfile.mkdtemp(prefix="tr", dir="/tmp")  # short: Ray's socket paths must fit
            where = ["--head", "--include-dashboard", "false", "--temp-dir", self.temp_dir]
        else:
            self.temp_dir = None  # the head's holds this node's session too
            where = ["--address", f"127.0.0.1:{head_port}"]
        command = [str(Path(sys.executable).parent / "ray"), "start", "--block", *where, "--node-ip-address",
                   "127.0.0.1", "--num-cpus", "1", "--resources", json.dumps({resource: 1}),
                   "--object-store-memory", str(100 * 2**20), "--disable-usage-stats",
                   *[str(item) for pair in ports.items() for item in pair]]
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **NODE_ENV})
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            assert self.process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM: Ray drains the node and stops its raylet and workers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever it left behind
        except ProcessLookupError:
            pass
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def live_nodes() -> dict[str, dict]:
    """Node id -> resources of the cluster's live nodes (this process is connected to it)."""
    return {node["NodeID"]: node["Resources"] for node in ray.nodes() if node["Alive"]}


def wait_for(condition, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``(head port, nodes)``: the learner node (the head) and the rollout node, both live."""
    logs = tmp_path_factory.mktemp("ray-nodes")
    port = free_port()
    nodes = {"learner": RayNode(logs / "learner.log", "learner", port, head=True)}
    try:
        nodes["rollout"] = RayNode(logs / "rollout.log", "rollout", port, head=False)
        os.environ.update(RAY_AUTH_MODE="disabled")
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, namespace="tempering-test")
        wait_for(lambda: len(live_nodes()) == 2, "both nodes registered")
        yield port, nodes
    finally:
        ray.shutdown()
        for node in reversed(list(nodes.values())):
            node.stop()
        shutil.rmtree(logs, ignore_errors=True)


def ray_args(port: int) -> list[str]:
    return ["pipeline.backend=ray", "pipeline.learner=ray", f"pipeline.ray_address=127.0.0.1:{port}",
            "pipeline.learner_resources={learner: 1}", "pipeline.rollout_resources={rollout: 0.5}",
            "pipeline.reward_resources={rollout: 0.5}", "pipeline.actor_start_s=120"]


def temper(*args: str, stop_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, **NODE_ENV}
    if stop_at:
        env["TEMPERING_STOP_AT"] = stop_at
    return subprocess.Popen([sys.executable, "-m", "tempering.cli", "train", "--quiet", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


@pytest.fixture(scope="module")
def two_node_run(cluster, tiny_model_dir, tmp_path_factory) -> Path:
    """The run folder of an uninterrupted 6-step run on the cluster."""
    port, _ = cluster
    run = tmp_path_factory.mktemp("two-node") / "run"
    code, err = finished(temper(*ARGS, f"model.path={tiny_model_dir}", "--run-dir", str(run), *ray_args(port)))
    assert code == 0, err[-3000:]
    return run


def test_the_learner_runs_on_its_node_the_workers_on_theirs_and_the_numbers_are_a_local_runs(
        two_node_run: Path, tiny_model_dir: Path, tmp_path: Path):
    from tempering.train import train

    summary = json.loads((two_node_run / "summary.json").read_text())
    nodes = {node["NodeID"]: node["Resources"] for node in ray.nodes()}
    placed = summary["ray_nodes"]
    assert [len(placed[kind]) for kind in ("learner", "rollout", "reward")] == [1, 1, 1], placed
    assert "learner" in nodes[placed["learner"][0]] and "rollout" not in nodes[placed["learner"][0]]
    assert all("rollout" in nodes[placed[kind][0]] for kind in ("rollout", "reward"))

    local = train(load_config(None, [*ARGS, f"model.path={tiny_model_dir}", f"run_dir={tmp_path / 'local'}"]),
                  progress=False)
    assert "ray_nodes" not in local
    # One thread everywhere, the same seed and the same weights: the same arithmetic in other processes.
    assert step_records(two_node_run) == step_records(tmp_path / "local")
    assert weights(two_node_run) == weights(tmp_path / "local")
    assert summary["eval_after"] == local["eval_after"]
    assert step_records(two_node_run)[-1]["loss"] != 0


def test_a_stopped_node_stops_the_run_with_a_message_and_resume_ends_as_if_uninterrupted(
        cluster, two_node_run: Path, tiny_model_dir: Path, tmp_path: Path):
    port, nodes = cluster
    run = tmp_path / "run"
    # The driver halts itself as its 4th sampling round starts (step 2's checkpoint written, step 3 done).
    proc = temper(*ARGS, f"model.path={tiny_model_dir}", "--run-dir", str(run), *ray_args(port), stop_at="round:4")
    wait_for(lambda: proc.poll() is not None or Path(f"/proc/{proc.pid}/stat").read_text().split()[2] == "T",
             "the driver reached round 4", timeout=300)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    rollout_node = next(n for n, res in live_nodes().items() if "rollout" in res)
    nodes["rollout"].stop()
    wait_for(lambda: rollout_node not in live_nodes(), "the cluster saw the rollout node go")
    proc.send_signal(signal.SIGCONT)
    code, err = finished(proc)
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    assert "pipeline.rollout_resources={rollout: 0.5}" in err and "cannot be started again" in err, err
    assert f"temper train --resume {run}" in err, err
    assert [r["step"] for r in step_records(run)] == [1, 2, 3]

    nodes["rollout"] = RayNode(nodes["rollout"].log, "rollout", port, head=False)
    wait_for(lambda: len(live_nodes()) == 2, "the rollout node is back")
    code, err = finished(temper("--resume", str(run)))
    assert code == 0, err[-3000:]
    assert json.loads((run / "summary.json").read_text())["resumed_from"] == 2
    assert weights(run) == weights(two_node_run)
    assert step_records(run) == step_records(two_node_run)


def test_a_resource_no_node_offers_is_refused_naming_the_field(cluster, tiny_model_dir: Path, tmp_path: Path):
    port, _ = cluster
    code, err = finished(temper(*ARGS, f"model.path={tiny_model_dir}", "--run-dir", str(tmp_path / "run"),
                                *ray_args(port), "pipeline.learner_resources={gpu_box: 1}"))
    assert code == 2, err[-3000:]
    assert "pipeline.learner_resources={gpu_box: 1}: no live node" in err and "Traceback" not in err, err
