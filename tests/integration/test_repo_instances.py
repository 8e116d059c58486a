"""Every defect of every ``repo`` family, run: the original repository fails each of its
FAIL_TO_PASS tests and passes each PASS_TO_PASS and visible test, the reference patch passes
them all, and at level 2 the naive patch passes the issue's tests but breaks another module's,
as the visible tests show.

The tests are our own generated programs, so they run in a plain child process (one per
instance, every state in its own folder), each test module imported and each function called
as the grader calls it, without pytest."""

import json
import random
import subprocess
import sys
import textwrap

import pytest

from tempering.tasks.repo import FAMILIES
from tempering.tasks.repo_families import build_instance, find_tests
from tempering.tasks.repo_records import RepoInstance, apply_patch

RUNNER = textwrap.dedent('''
    import importlib.util, json, os, sys
    sys.dont_write_bytecode = True
    before = set(sys.modules)
    results = []
    for folder, ids in json.loads(sys.argv[1]):
        os.chdir(folder)
        sys.path.insert(0, folder)
        for name in set(sys.modules) - before:  # each folder imports its own package afresh
            del sys.modules[name]
        modules, passed = {}, {}
        for test_id in ids:
            path, name = test_id.split("::")
            try:
                if path not in modules:
                    spec = importlib.util.spec_from_file_location(path[:-3].replace("/", "."), path)
                    modules[path] = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(modules[path])
                getattr(modules[path], name)()
                passed[test_id] = True
            except BaseException:
                passed[test_id] = False
        sys.path.remove(folder)
        results.append(passed)
    print(json.dumps(results))
''')


def run_tests(tmp_path, states: dict[str, tuple[dict[str, str], list[str]]]) -> dict[str, dict[str, bool]]:
    """Whether each test id passes in each state (files written to a folder of their own), all
    in one child process that imports each test module and calls the functions."""
    jobs = []
    for label, (files, ids) in states.items():
        folder = tmp_path / label
        for path, text in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text)
        jobs.append([str(folder), ids])
    out = subprocess.run([sys.executable, "-S", "-c", RUNNER, json.dumps(jobs)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(zip(states, json.loads(out.stdout)))


def visible_tests(instance: RepoInstance) -> list[str]:
    return [f"{path}::{name}" for path, text in sorted(instance.files.items()) if path.startswith("tests/")
            for name in find_tests(text)]


DEFECTS = [(family, defect) for family in FAMILIES for defect in family.defects]


@pytest.mark.parametrize("family,defect", DEFECTS, ids=[f"{f.name}-{d.name}" for f, d in DEFECTS])
def test_the_original_fails_the_issue_tests_the_patch_fixes_them_and_the_naive_fix_breaks_a_module(
        tmp_path, family, defect):
    rng = random.Random(f"run:{family.name}:{defect.name}")
    instance = build_instance(family, defect, {"pkg": rng.choice(family.packages), **family.draw(rng)})
    hidden = list(instance.FAIL_TO_PASS + instance.PASS_TO_PASS)
    states = {"original": ({**instance.files, **instance.hidden_tests}, hidden),
              "visible": (instance.files, visible_tests(instance)),
              "fixed": ({**apply_patch(instance.files, instance.patch), **instance.hidden_tests}, hidden)}
    if defect.level == 2:
        naive = apply_patch(instance.files, instance.meta["naive_patch"])
        states["naive"] = ({**naive, **instance.hidden_tests}, hidden)
        states["naive_visible"] = (naive, visible_tests(instance))
    passed = run_tests(tmp_path, states)
    assert not any(passed["original"][t] for t in instance.FAIL_TO_PASS)
    assert all(passed["original"][t] for t in instance.PASS_TO_PASS)
    assert all(passed["visible"].values()) and passed["visible"], "the visible tests pass before the fix"
    assert all(passed["fixed"].values())
    if defect.level == 2:
        assert all(passed["naive"][t] for t in instance.FAIL_TO_PASS), "the naive fix fixes the issue's tests"
        broken = [t for t in instance.PASS_TO_PASS if not passed["naive"][t]]
        assert any(not t.startswith(f"tests/test_{defect.home}_") for t in broken), "and breaks another module's"
        assert not all(passed["naive_visible"].values()), "which the visible tests show"
