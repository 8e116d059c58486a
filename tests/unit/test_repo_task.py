"""The ``repo`` task: generated repositories (their shape per level), a held-out split disjoint
by content, records read from users' files, and the unified-diff helpers. Running the
instances' tests is tests/integration/test_repo_instances.py."""

import collections
import json
import random

import pytest

from tempering.build import build_tasks
from tempering.config import ConfigError, validate_config
from tempering.tasks import build_task
from tempering.tasks.dataset import DatasetError
from tempering.tasks.repo import FAMILIES, LEVELS, RepoTask
from tempering.tasks.repo_families import build_instance, split_key
from tempering.tasks.repo_records import RecordError, RepoInstance, apply_patch, make_patch

DEFECTS = [(family, defect) for family in FAMILIES for defect in family.defects]


def instance_of(family, defect, sample: int) -> RepoInstance:
    rng = random.Random(f"test:{family.name}:{defect.name}:{sample}")
    return build_instance(family, defect, {"pkg": rng.choice(family.packages), **family.draw(rng)})


def test_six_families_each_with_every_level():
    assert [f.name for f in FAMILIES] == ["inventory", "ledger", "scheduler", "converter", "tokenizer", "config"]
    for family in FAMILIES:
        assert {d.level for d in family.defects} == set(LEVELS), family.name
        assert 2 <= len(family.modules) <= 6
        assert all(d.naive for d in family.defects if d.level == 2), family.name


def test_patch_shapes_match_the_levels():
    for family, defect in DEFECTS:
        instance = instance_of(family, defect, sample=1)
        changed = [line for line in instance.patch.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        files = {line[6:] for line in instance.patch.splitlines() if line.startswith("+++ b/")}
        if defect.level == 1:
            assert len(changed) == 2 and len(files) == 1, (family.name, defect.name, instance.patch)
        elif defect.level == 2:
            assert files == {f"{instance.meta['params']['pkg']}/{defect.home}.py"}
            assert instance.meta["naive_patch"] and instance.meta["naive_patch"] != instance.patch
        else:
            assert len(files) == 2, (family.name, defect.name)
        assert not any(path.startswith("tests/") for path in files)


def test_problems_are_a_pure_function_of_seed_and_index():
    a, b = build_task("repo", seed=3), build_task("repo", seed=3)
    assert [a.train_problem(i).meta["repo"] for i in range(30)] == [b.train_problem(i).meta["repo"] for i in range(30)]
    assert [p.id for p in a.eval_problems(20)] == [p.id for p in b.eval_problems(20)]
    assert [p.id for p in build_task("repo", seed=4).eval_problems(20)] == [p.id for p in a.eval_problems(20)]
    other = build_task("repo", seed=4)
    assert sum(a.train_problem(i).id != other.train_problem(i).id for i in range(30)) >= 25


@pytest.fixture(scope="module")
def train():
    task = build_task("repo", seed=0)
    return [task.train_problem(i) for i in range(2000)]


def test_thousands_of_distinct_instances(train):
    assert len({p.id for p in train}) >= 1950
    assert len({json.dumps(p.meta["repo"]["files"], sort_keys=True) for p in train}) >= 1950
    assert set(collections.Counter(p.meta["defect"] for p in train)) == {d.name for _, d in DEFECTS}


def test_held_out_instances_are_disjoint_from_training_by_content(train):
    held_out = build_task("repo", seed=0).eval_problems(300)
    assert len(held_out) == 300

    def content(problem, rename=False):
        record = problem.meta["repo"]
        text = json.dumps([record["problem_statement"], record["files"], record["hidden_tests"]], sort_keys=True)
        return text.replace(problem.meta["repo"]["meta"]["params"]["pkg"], "PKG") if rename else text

    for rename in (False, True):  # also under another package name: the same fix is never on both sides
        assert not {content(p, rename) for p in held_out} & {content(p, rename) for p in train}
    keys = {p.id: split_key(*_defect_of(p), p.meta["repo"]["meta"]["params"]) for p in train + held_out}
    assert not {keys[p.id] for p in held_out} & {keys[p.id] for p in train}
    assert all(RepoTask.is_held_out(keys[p.id]) for p in held_out)
    assert not any(RepoTask.is_held_out(keys[p.id]) for p in train)
    for problem in held_out[:20]:  # the same instance under any other package name is held out too
        family, defect = _defect_of(problem)
        params = problem.meta["repo"]["meta"]["params"]
        for pkg in family.packages:
            assert RepoTask.is_held_out(split_key(family, defect, {**params, "pkg": pkg}))
    assert {(p.meta["family"], p.meta["level"]) for p in held_out} == {(f.name, d.level) for f, d in DEFECTS}


def _defect_of(problem):
    family = next(f for f in FAMILIES if f.name == problem.meta["family"])
    return family, next(d for d in family.defects if d.name == problem.meta["defect"])


def test_the_problem_carries_its_record_the_rewards_and_a_short_prompt():
    task = build_task("repo", seed=0, families=["ledger"], levels=[2])
    problem = task.train_problem(0)
    record = problem.meta["repo"]
    assert json.loads(json.dumps(record)) == record
    instance = RepoInstance.from_record(record)
    assert instance.to_record() == record and problem.id == instance.instance_id
    assert problem.meta["family"] == "ledger" and problem.meta["level"] == 2
    assert task.rewards == {"repo": 1.0} and task.metric == "repo"
    text = problem.prompt[0]["content"]
    assert text.startswith(instance.problem_statement) and all(path in text for path in instance.files)
    assert not any(path in text for path in instance.hidden_tests) and len(text) < 1500
    assert problem.answer == instance.patch
    assert isinstance(build_task("repo", seed=0, style="raw").train_problem(0).prompt, str)


def test_options_are_checked():
    with pytest.raises(ValueError, match="unknown repo families \\['bakery'\\]; known: inventory"):
        build_task("repo", seed=0, families=["bakery"])
    with pytest.raises(ValueError, match="levels must be a non-empty list of 1, 2 or 3"):
        build_task("repo", seed=0, levels=[4])
    with pytest.raises(ValueError, match="options.families: not an option of the repo task with options.path"):
        build_task("repo", seed=0, path="x.jsonl", families=["ledger"])
    with pytest.raises(ValueError, match="options.levels="):
        build_task("repo", seed=0, levels="two")


def test_the_stream_resumes_exactly_and_refuses_other_options():
    task = build_task("repo", seed=5, levels=[1, 3])
    [task.train_problem(i) for i in range(7)]
    state = json.loads(json.dumps(task.state_dict()))
    resumed = build_task("repo", seed=5, levels=[1, 3])
    resumed.load_state_dict(state)
    assert resumed.next_index == 7 and resumed.train_problem(7).meta["repo"] == task.train_problem(7).meta["repo"]
    with pytest.raises(ValueError, match="drawn_levels"):
        build_task("repo", seed=5, levels=[2]).load_state_dict(state)


# -- records of users' own repositories -----------------------------------------------------

def _record(i: int, **changes):
    record = {"instance_id": f"calc-{i}", "problem_statement": f"add({i}, 1) is wrong (case {i})",
              "files": {"calc/__init__.py": "", "calc/ops.py": "def add(a, b):\n    return a - b\n"},
              "hidden_tests": {"tests/test_ops.py": f"from calc.ops import add\n\n\ndef test_add():\n"
                                                    f"    assert add({i}, 1) == {i + 1}\n"},
              "FAIL_TO_PASS": ["tests/test_ops.py::test_add"], "PASS_TO_PASS": [],
              "patch": "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
                       "-    return a - b\n+    return a + b\n"}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not None}


def _write(tmp_path, records, name="instances.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_records_load_as_a_task_with_snapshots_relative_to_the_file(tmp_path):
    snapshot = tmp_path / "snapshots" / "calc-s"
    (snapshot / "calc").mkdir(parents=True)
    (snapshot / "calc" / "ops.py").write_text("def add(a, b):\n    return a - b\n")
    (snapshot / "calc" / "__init__.py").write_text("")
    records = [_record(i) for i in range(40)]
    records.append(_record(99, instance_id="calc-s", files=None, snapshot="snapshots/calc-s"))
    task = build_task("repo", seed=0, path=_write(tmp_path, records), eval_fraction=0.2)
    problems = [task.train_problem(i) for i in range(task.size)] + task.eval_problems(100)
    assert len({p.id for p in problems}) == 41 and task.eval_problems(100)
    assert not {p.id for p in task.eval_problems(100)} & {task.train_problem(i).id for i in range(task.size)}
    loaded = next(p for p in problems if p.id == "calc-s").meta["repo"]
    assert loaded["files"]["calc/ops.py"] == "def add(a, b):\n    return a - b\n"
    assert problems[0].meta["record"].startswith(str(tmp_path / "instances.jsonl:"))
    assert task.rewards == {"repo": 1.0} and task.metric == "repo"
    fixed = apply_patch(loaded["files"], loaded["patch"])
    assert fixed["calc/ops.py"].endswith("return a + b\n")


@pytest.mark.parametrize("change,message", [
    ({"problem_statement": None}, r"instances.jsonl:2: missing field 'problem_statement'"),
    ({"FAIL_TO_PASS": "tests/test_ops.py::test_add"}, r"instances.jsonl:2: FAIL_TO_PASS: not a JSON list"),
    ({"FAIL_TO_PASS": ["tests/test_other.py::test_add"]}, r"instances.jsonl:2: calc-1: FAIL_TO_PASS names "
                                                          r"'tests/test_other.py::test_add'"),
    ({"files": {"../etc/passwd": "x"}}, r"instances.jsonl:2: files: path '../etc/passwd' must be relative"),
    ({"patch": "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a * b\n"
               "+    return a + b\n"}, r"instances.jsonl:2: patch: calc/ops.py: hunk 1 does not apply"),
    ({"instance_id": "calc-0"}, r"instances.jsonl:2: field 'instance_id': 'calc-0' is also the id of the record at "
                                r".*instances.jsonl:1"),
    ({"files": None, "snapshot": "missing"}, r"instances.jsonl:2: snapshot: .*missing' is not a folder"),
    ({"problem_statement": "  "}, r"instances.jsonl:2: problem_statement: must be non-empty text"),
    ({"PASS_TO_PASS": ["tests/test_ops.py::test_sub"]}, r"instances.jsonl:2: PASS_TO_PASS: "
                                                        r"'tests/test_ops.py::test_sub' names no top-level 'def test_sub\(\):'"),
])
def test_a_bad_record_names_the_file_line_and_field(tmp_path, change, message):
    path = _write(tmp_path, [_record(0), _record(1, **change)])
    with pytest.raises(DatasetError, match=message):
        build_task("repo", seed=0, path=path)
    config = validate_config({"tasks": [{"name": "repo", "options": {"path": path}}]})
    with pytest.raises(ConfigError, match=r"tasks.0 \(repo\): .*" + message):
        build_tasks(config)


# -- unified diffs ----------------------------------------------------------------------------

def test_make_patch_and_apply_patch_round_trip_creations_deletions_and_missing_newlines():
    before = {"a.py": "one\ntwo\nthree\n", "gone.py": "x\n", "tail.py": "no newline"}
    after = {"a.py": "one\n2\nthree\nfour\n", "new/b.py": "print(1)\n", "tail.py": "no newline, still"}
    diff = make_patch(before, after)
    assert "--- a/gone.py\n+++ /dev/null" in diff and "--- /dev/null\n+++ b/new/b.py" in diff
    assert "\\ No newline at end of file" in diff
    assert apply_patch(before, diff) == after and before["a.py"] == "one\ntwo\nthree\n"
    assert make_patch(after, after) == ""


def test_apply_patch_finds_a_moved_hunk_but_refuses_changed_text():
    diff = make_patch({"m.py": "a\nb\nc\n"}, {"m.py": "a\nB\nc\n"})
    assert apply_patch({"m.py": "x\ny\na\nb\nc\n"}, diff) == {"m.py": "x\ny\na\nB\nc\n"}
    with pytest.raises(RecordError, match=r"patch: m.py: hunk 1 does not apply: its old lines"):
        apply_patch({"m.py": "a\nz\nc\n"}, diff)
    with pytest.raises(RecordError, match="patch: m.py: no such file in the repository"):
        apply_patch({}, diff)
    with pytest.raises(RecordError, match="patch: n.py: the diff adds it"):
        apply_patch({"n.py": ""}, make_patch({}, {"n.py": "x\n"}))
    with pytest.raises(RecordError, match=r"patch: \.\./x: path outside the repository"):
        apply_patch({}, "--- a/../x\n+++ b/../x\n@@ -0,0 +1 @@\n+x\n")
