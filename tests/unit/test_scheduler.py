"""The static task mixture: weights, per-task cursors, and a state that resumes exactly."""

import json

import pytest

from tempering.build import scheduler_settings
from tempering.config import SchedulerConfig
from tempering.scheduler import StaticMixture
from tempering.tasks import build_task

SETTINGS = scheduler_settings(SchedulerConfig())


def _tasks():
    return [build_task(name, seed=0) for name in ("add", "sub", "mul")]


def test_each_task_serves_its_training_stream_in_order():
    tasks = _tasks()
    mixture = StaticMixture(tasks, [1.0, 1.0, 1.0], seed=0, settings=SETTINGS)
    problems = mixture.next_problems(30)
    for task in tasks:
        mine = [p for p in problems if p.task == task.name]
        assert mine == [task.train_problem(i) for i in range(len(mine))]
        assert mixture.cursors[task.name] == len(mine)
    assert all(mixture.cursors.values()), "every task with weight is drawn"


def test_a_task_with_weight_zero_is_never_trained_on():
    mixture = StaticMixture(_tasks(), [1.0, 0.0, 2.0], seed=0, settings=SETTINGS)
    assert {p.task for p in mixture.next_problems(200)} == {"add", "mul"}


def test_the_same_seed_draws_the_same_problems():
    assert StaticMixture(_tasks(), [1, 1, 1], seed=4, settings=SETTINGS).next_problems(20) == \
        StaticMixture(_tasks(), [1, 1, 1], seed=4, settings=SETTINGS).next_problems(20)


def test_a_restored_state_continues_with_the_same_problems():
    mixture = StaticMixture(_tasks(), [1, 2, 3], seed=0, settings=SETTINGS)
    mixture.next_problems(7)
    state = json.loads(json.dumps(mixture.state_dict()))  # as a checkpoint would store it
    expected = mixture.next_problems(10)

    resumed = StaticMixture(_tasks(), [1, 2, 3], seed=99, settings=SETTINGS)
    resumed.load_state_dict(state)
    assert resumed.next_problems(10) == expected


def test_the_mixture_state_holds_each_tasks_stream_state():
    mixture = StaticMixture(_tasks(), [1, 2, 3], seed=0, settings=SETTINGS)
    mixture.next_problems(12)
    state = json.loads(json.dumps(mixture.state_dict()))
    assert {name: s["next_index"] for name, s in state["tasks"].items()} == mixture.cursors
    resumed = StaticMixture(_tasks(), [1, 2, 3], seed=0, settings=SETTINGS)
    resumed.load_state_dict(state)
    assert {t.name: t.next_index for t in resumed.tasks} == mixture.cursors


@pytest.mark.parametrize("weights, message", [
    ([1.0, 1.0], "one weight per task"),
    ([0.0, 0.0, 0.0], "at least one task needs a positive training weight"),
])
def test_bad_weights_are_refused(weights, message):
    with pytest.raises(ValueError, match=message):
        StaticMixture(_tasks(), weights, seed=0, settings=SETTINGS)


def test_a_code_task_drawing_from_several_levels_is_not_taken_for_a_curriculum():
    from tempering.types import Group, Rollout

    task = build_task("code", seed=0, levels=[1, 2])
    mixture = StaticMixture([task], [1.0], seed=0, settings=SETTINGS)
    problem = mixture.next_problems(1)[0]
    rollout = Rollout(problem, [1], [2], [0.0], "x", "stop", 0, reward_components={"code": 1.0})
    mixture.observe([Group(problem, [rollout])])
    record = mixture.update()
    assert record["domain/code/success"] == 1.0 and "domain/code/level" not in record
    assert task.drawn_levels == [1, 2]


def test_a_task_whose_levels_is_not_a_count_is_not_taken_for_a_curriculum():
    from tempering.types import Group, Rollout

    task = build_task("add", seed=0)
    task.levels = [1, 2]  # a plug-in task's own meaning of the name: the levels it draws from
    mixture = StaticMixture([task], [1.0], seed=0, settings=SETTINGS)
    problem = mixture.next_problems(1)[0]
    rollout = Rollout(problem, [1], [2], [0.0], "x", "stop", 0, reward_components={"exact_match": 1.0})
    mixture.observe([Group(problem, [rollout])])
    assert "domain/add/level" not in mixture.update()
