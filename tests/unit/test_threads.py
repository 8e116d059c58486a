"""Choosing torch's threads from the cores other processes leave free.

The counting is checked on /proc/stat readings written out by hand; the whole choice is
checked beside a real process that keeps one core busy. Assertions are on thread counts,
never on time.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from tempering import threads
from tempering.threads import CpuSample, ThreadGovernor, free_cores, parse_stat, threads_for

STAT = """\
cpu  167647 2115 18621 106799 515 0 88 777 0 0
cpu0 77066 1179 8154 61317 101 0 26 380 0 0
cpu1 90581 936 10467 45481 413 0 62 396 5 0
intr 759076 0 0 0 0 0 0 0 0
ctxt 1275743
btime 1796095059
procs_running 5
"""


def reading(cores: dict[int, tuple[int, int]], own_s: float = 0.0, wall_s: float = 0.0) -> CpuSample:
    return CpuSample(cores, own_s, wall_s)


def test_parse_stat_gives_idle_with_iowait_and_total_up_to_steal_per_core():
    assert parse_stat(STAT) == {
        0: (61317 + 101, 77066 + 1179 + 8154 + 61317 + 101 + 0 + 26 + 380),
        1: (45481 + 413, 90581 + 936 + 10467 + 45481 + 413 + 0 + 62 + 396),
    }


def test_parse_stat_of_a_real_reading_covers_the_allowed_cores():
    assert threads.allowed_cpus() <= threads.sample().cores.keys()


def test_a_busy_core_and_an_idle_core_make_one_free_core():
    before = reading({0: (0, 0), 1: (0, 0)})
    after = reading({0: (2, 100), 1: (97, 100)}, wall_s=1.0)
    assert free_cores(before, after, {0, 1}) == pytest.approx(0.99)


def test_the_process_own_cpu_time_counts_as_free():
    """While the run itself keeps both cores busy, both are still its to use."""
    before = reading({0: (0, 0), 1: (0, 0)}, own_s=10.0, wall_s=5.0)
    after = reading({0: (0, 100), 1: (10, 100)}, own_s=11.9, wall_s=6.0)
    assert free_cores(before, after, {0, 1}) == pytest.approx(2.0)


def test_cores_outside_the_affinity_mask_are_not_counted():
    before = reading({0: (0, 0), 1: (0, 0), 2: (0, 0)})
    after = reading({0: (100, 100), 1: (100, 100), 2: (100, 100)}, wall_s=1.0)
    assert free_cores(before, after, {1, 2}) == pytest.approx(2.0)


def test_free_cores_never_exceed_the_allowed_ones():
    before = reading({0: (0, 0)}, own_s=0.0, wall_s=0.0)
    after = reading({0: (100, 100)}, own_s=1.0, wall_s=1.0)
    assert free_cores(before, after, {0}) == 1.0


@pytest.mark.parametrize("free, allowed, share, expected", [
    (0.0, 2, 1, 1), (0.69, 2, 1, 1), (1.69, 2, 1, 1), (1.7, 2, 1, 2), (2.0, 2, 1, 2),
    (7.9, 4, 1, 4), (3.0, 8, 1, 3), (1.0, 2, 2, 1), (4.0, 4, 2, 2),
])
def test_threads_for_counts_cores_that_are_mostly_free(free, allowed, share, expected):
    assert threads_for(free, allowed, share) == expected


@pytest.fixture
def busy_core():
    """A real process spinning on one core for the length of a test."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)  # started and on a core
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_auto_picks_fewer_threads_than_cores_beside_a_busy_process(busy_core):
    assert threads.auto_threads() < len(os.sched_getaffinity(0))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_governor_in_auto_mode_sets_torch_below_the_core_count_beside_a_busy_process(busy_core):
    try:
        governor = ThreadGovernor(0)
        assert governor.threads == torch.get_num_threads() < len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(1)


def test_governor_with_a_fixed_count_sets_it_and_never_recounts(monkeypatch):
    try:
        governor = ThreadGovernor(3, every=1)
        monkeypatch.setattr(threads, "sample", lambda: pytest.fail("a fixed count was re-counted"))
        assert torch.get_num_threads() == 3
        assert [governor.update() for _ in range(3)] == [{}, {}, {}]
    finally:
        torch.set_num_threads(1)


def test_governor_follows_load_every_n_steps(monkeypatch):
    """One core busy: one thread; it frees up: two; re-counted only on every second step."""
    readings = iter([
        reading({0: (0, 0), 1: (0, 0)}),  # at start-up, after the start-up choice of two
        reading({0: (0, 100), 1: (5, 100)}, own_s=0.95, wall_s=1.0),  # other process holds core 0
        reading({0: (100, 200), 1: (10, 200)}, own_s=1.9, wall_s=2.0),  # it has gone
    ])
    monkeypatch.setattr(threads, "sample", lambda: next(readings))
    monkeypatch.setattr(threads, "allowed_cpus", lambda: {0, 1})
    monkeypatch.setattr(threads, "auto_threads", lambda share: 2)
    try:
        governor = ThreadGovernor(0, every=2)
        assert torch.get_num_threads() == 2
        assert governor.update() == {"threads": 2}
        assert governor.update() == {"threads": 1} and torch.get_num_threads() == 1
        assert governor.update() == {"threads": 1}
        assert governor.update() == {"threads": 2} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_run_with_auto_threads_beside_a_busy_process_uses_fewer_threads_than_cores(busy_core, tiny_model_dir,
                                                                                     tmp_path):
    """The defect: ``threads: 0`` meant every core, busy or not, and the run crawled."""
    from tempering.config import TrainConfig
    from tempering.train import train

    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    config = TrainConfig.model_validate({
        "steps": 1, "threads": 0, "pretrain": pretrain, "run_dir": str(tmp_path / "run"),
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8},
        "eval": {"problems_per_task": 2, "max_new_tokens": 8},
    })
    try:
        train(config, progress=False)
        assert torch.get_num_threads() < len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(1)
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert record["threads"] < len(os.sched_getaffinity(0))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_pretraining_with_auto_threads_beside_a_busy_process_uses_fewer_threads_than_cores(busy_core, tmp_path):
    from tempering.config import PretrainConfig
    from tempering.pretrain import pretrain

    config = PretrainConfig(hidden_size=16, layers=1, heads=2, steps=2, batch_docs=2, warmup_steps=0)
    try:
        pretrain(config, tmp_path, progress=False, threads=0)
        assert torch.get_num_threads() < len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(1)


def test_pretraining_inside_a_run_keeps_the_run_s_threads(tmp_path):
    from tempering.config import PretrainConfig
    from tempering.pretrain import pretrain

    torch.set_num_threads(1)
    pretrain(PretrainConfig(hidden_size=16, layers=1, heads=2, steps=2, batch_docs=2), tmp_path, progress=False)
    assert torch.get_num_threads() == 1


def openmp_spin_count_in_temper(**env: str) -> str:
    """How long OpenMP threads inside ``temper`` spin before sleeping, as OpenMP reports it
    when it loads (libgomp shows "PASSIVE" even for its default of spinning, so the count is
    what tells)."""
    result = subprocess.run([sys.executable, "-m", "tempering.cli", "--help"], capture_output=True, text=True,
                            env={**os.environ, "OMP_DISPLAY_ENV": "VERBOSE", **env}, check=True)
    return re.search(r"GOMP_SPINCOUNT = '(\d+)'", result.stderr).group(1)


def test_temper_makes_openmp_threads_sleep_rather_than_spin_while_they_wait(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert openmp_spin_count_in_temper() == "0"


def test_temper_keeps_a_wait_policy_the_user_set():
    assert openmp_spin_count_in_temper(OMP_WAIT_POLICY="ACTIVE") == "30000000000"
