"""reasoning-gym task types: every one loads, and its reference answer scores 1 through the reward."""

import time

import pytest

pytest.importorskip("reasoning_gym")

from tempering.rewards import build_reward
from tempering.tasks import build_task
from tempering.tasks.reasoning_gym import NO_REFERENCE, PREFETCH_AHEAD, SLOW_TYPES, rg_types
from tempering.types import Rollout


def _score(problem, text: str) -> float:
    rollout = Rollout(problem, [], [], [], text, "stop", 0)
    return build_reward("reasoning_gym").score_batch([problem], [rollout])[0].score


def test_there_is_a_domain_for_every_reasoning_gym_type():
    assert len(rg_types()) >= 100 and "composite" not in rg_types()


VALIDATED = ["graph_color", "rubiks_cube", "propositional_logic", "boxnet", "rush_hour"]


@pytest.mark.parametrize("rg_type", [pytest.param(t, marks=pytest.mark.slow) for t in rg_types() if t not in VALIDATED + ["basic_arithmetic"]]
                         + ["basic_arithmetic"] + VALIDATED)
def test_each_types_reference_answer_scores_one(rg_type):
    """All types under -m slow (about 20 s); the validated ones and one compared one always."""
    task = build_task(f"rg:{rg_type}", seed=0, eval_size=2)
    problem = task.train_problem(0)
    assert problem.task == f"rg:{rg_type}" and problem.domain == f"rg:{rg_type}"
    if rg_type in NO_REFERENCE:  # validated by a planner; reasoning-gym keeps no solution
        assert problem.answer == "" and _score(problem, "<answer>no idea</answer>") < 1.0
    else:
        assert _score(problem, f"reasoning first\n<answer>{problem.answer}</answer>") == 1.0


def test_the_answer_line_is_read_when_there_are_no_tags():
    problem = build_task("rg:basic_arithmetic", seed=0, eval_size=2).train_problem(3)
    assert _score(problem, f"answer: {problem.answer}") == 1.0
    assert _score(problem, "answer: not a number") < 1.0


def test_evaluation_asking_for_more_than_the_held_out_set_gets_all_of_it():
    task = build_task("rg:basic_arithmetic", seed=0, eval_size=2)
    assert task.eval_problems(200) == task.eval_problems(2) and len(task.eval_problems(2)) == 2


@pytest.mark.parametrize("rg_type", ["basic_arithmetic", "coin_flip", "acre"])
def test_training_stream_is_deterministic_and_never_repeats_a_held_out_question(rg_type):
    task = build_task(f"rg:{rg_type}", seed=0, eval_size=32)
    stream = [task.train_problem(i) for i in range(60)]
    held_out = {p.meta["entry"]["question"] for p in task.eval_problems(32)}
    assert not held_out & {p.meta["entry"]["question"] for p in stream}
    again = build_task(f"rg:{rg_type}", seed=0, eval_size=32)
    assert [again.train_problem(i).prompt for i in (59, 0, 7)] == [stream[i].prompt for i in (59, 0, 7)]
    other_seed = build_task(f"rg:{rg_type}", seed=1, eval_size=32)
    assert other_seed.eval_problems(32) == task.eval_problems(32), "the held-out split is the same for every run"


def test_a_curriculum_level_makes_harder_items():
    task = build_task("rg:basic_arithmetic", seed=0, curriculum=True, eval_size=2)
    assert task.levels > 1
    easy = task.train_problem(0).meta["entry"]["metadata"]["num_terms"]
    task.level = task.levels - 1
    hard = task.train_problem(0).meta["entry"]["metadata"]["num_terms"]
    assert hard > easy


@pytest.mark.parametrize("options, message", [
    ({"type": "no_such_type"}, "unknown reasoning-gym type 'no_such_type'"),
    ({"type": "basic_arithmetic", "style": "xml"}, "style must be"),
    ({"type": "basic_arithmetic", "config": {"no_such_field": 1}}, "bad config"),
])
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        build_task("rg:custom", seed=0, **options).train_problem(0)


def _stream(task, n, climb_at=None):
    problems = []
    for i in range(n):
        if i == climb_at:
            task.level = 1
        problems.append(task.train_problem(i))
    return problems


def test_prefetching_serves_the_same_stream_as_generating_on_demand():
    def build(prefetch):
        return build_task("rg:basic_arithmetic", seed=1, curriculum=True, eval_size=8, prefetch=prefetch)

    plain, ahead = build(0), build(4)
    made_here = []
    make = ahead._source.item  # the worker, forked when the task was built, keeps the unwrapped one
    ahead._source.item = lambda *args: made_here.append(args) or make(*args)
    try:
        assert ahead.eval_problems(8) == plain.eval_problems(8)
        expected = _stream(plain, 30, climb_at=12)
        assert _stream(ahead, 30, climb_at=12) == expected
        assert [index for index, _ in made_here] == [ahead._seed_index(0, 0), ahead._seed_index(12, 0)], \
            "only the first item and the first after the level change are made here, the rest by the worker"
        assert sorted(i for _, i in ahead._ahead) == [ahead._seed_index(i, 0) for i in range(30, 34)], \
            "the worker holds the next items"
        resumed = build(4)
        resumed.load_state_dict(ahead.state_dict())
        assert _stream(resumed, 40)[30:] == _stream(plain, 40)[30:]
    finally:
        ahead.close()
        resumed.close()


@pytest.mark.slow
@pytest.mark.parametrize("rg_type", ["knight_swap", "zebra_puzzles", "arc_agi"])
def test_slow_types_prefetch_by_default_and_serve_the_same_stream(rg_type):
    ahead = build_task(f"rg:{rg_type}", seed=0, eval_size=4)
    try:
        assert ahead.prefetch == PREFETCH_AHEAD
        plain = build_task(f"rg:{rg_type}", seed=0, eval_size=4, prefetch=0)
        assert _stream(ahead, 12) == _stream(plain, 12)
    finally:
        ahead.close()


def test_only_slow_types_prefetch_by_default():
    assert build_task("rg:basic_arithmetic", seed=0).prefetch == 0
    assert SLOW_TYPES <= set(rg_types())
    with pytest.raises(ValueError, match="prefetch must be a count"):
        build_task("rg:basic_arithmetic", seed=0, prefetch=-1)


def _stuck(*args):
    time.sleep(3600)


def test_a_lost_worker_is_replaced_by_generating_here(monkeypatch):
    from tempering.tasks import reasoning_gym

    monkeypatch.setattr(reasoning_gym, "WORKER_WAIT_S", 0.5)
    monkeypatch.setattr(reasoning_gym, "_worker_item", _stuck)  # the (forked) worker never answers
    task = build_task("rg:basic_arithmetic", seed=0, eval_size=4, prefetch=2)
    expected = build_task("rg:basic_arithmetic", seed=0, eval_size=4, prefetch=0)
    assert [task.train_problem(i) for i in range(4)] == [expected.train_problem(i) for i in range(4)]
    assert task.prefetch == 0 and task._pool is None
