"""The live terminal view: a line per step on stdout, a per-domain table every N steps, the bar
with its ETA on stderr, nothing at all when quiet; greedy evaluation's progress bar."""

from __future__ import annotations

import re

from tempering.build import build_generator, build_tasks
from tempering.config import load_config
from tempering.eval.greedy import evaluate
from tempering.reporting.live import LiveView, step_line


def record(step: int) -> dict:
    return {"step": step, "reward": 0.5, "accuracy": 0.25, "completion_tokens": 80, "completion_length": 10.0,
            "entropy": 1.0, "kl": 0.01, "step_s": 1.5, "domain/add/weight": 0.5, "domain/add/reward": 0.5,
            "domain/add/success": 0.25, "domain/add/completion_tokens": 40, "domain/add/dropped_groups": 0,
            "domain/mul/weight": 0.5, "domain/mul/reward": 0.5}


def test_a_line_per_step_a_table_every_n_steps_and_a_bar_with_eta(capsys):
    view = LiveView(steps=4, first_step=0, table_every=2, enabled=True)
    for step in range(1, 5):
        view.update(record(step))
    view.close()
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("step ") and "/4" in line] == [
        f"step {s}/4  reward 0.500  acc 25.0%  len 10.0  kl 0.010  ent 1.000  1.50 s/step" for s in range(1, 5)]
    tables = [i for i, line in enumerate(lines) if line.split()[:2] in (["step", "2"], ["step", "4"])]
    assert len(tables) == 2
    assert lines[tables[0] + 1].split() == ["add", "50.0%", "0.500", "25.0%", "40", "0"]
    assert lines[tables[0] + 2].split() == ["mul", "50.0%", "0.500", "-", "-", "-"]  # keys the record lacks
    assert re.search(r"4/4 \[\d\d:\d\d<\d\d:\d\d", err)  # the bar, elapsed<remaining (its ETA), on stderr


def test_quiet_shows_nothing(capsys):
    view = LiveView(steps=2, first_step=0, table_every=1, enabled=False)
    view.update(record(1))
    view.close()
    assert capsys.readouterr() == ("", "")


def test_greedy_evaluation_shows_a_bar_of_problems(tiny_policy, capsys):
    model, tokenizer = tiny_policy
    config = load_config(None, ["tasks=[{name: add}]"])
    generator = build_generator(config, model, tokenizer, batch_size=8)
    evaluate(generator, build_tasks(config), 3, 8, progress=True)
    assert "greedy" in capsys.readouterr().err
    evaluate(generator, build_tasks(config), 3, 8)
    assert capsys.readouterr().err == ""


def test_the_step_line_shows_the_mean_completion_length_of_the_step():
    """``rollouts_taken`` counts every rollout since the start; the step's mean length is
    ``completion_length`` (the quickstart's third step showed 8.2 for 24.7-token answers)."""
    record = {"step": 3, "reward": 0.8, "accuracy": 0.7, "completion_tokens": 3157, "rollouts_taken": 384,
              "completion_length": 24.664, "step_s": 0.35}
    assert "len 24.7" in step_line(record, 3)
