"""RL in the repository gym: the run of ``configs/repo.yaml`` (the tiny coder pre-trained on
``env: repo`` transcripts, then GRPO in the environment, graded in a clean box) lifts the
episodes' reward past a stated margin; the same run with no advantage (the estimator zeroed)
does not. Both runs report held-out ``repo/fixed``, ``repo/broke_other_module`` and
``repo/test_runs`` before and after.

The model is the config's own (pre-trained once into the test session's cache: minutes).
"""

from __future__ import annotations

import pytest

from tempering.config import TrainConfig, builtin_config, load_config
from tempering.pretrain import ensure_pretrained
from tempering.reporting.metrics import read_jsonl
from tempering.train import train

from learning import check_lift

LIFT = 0.2
"""How much the mean reward of the last six steps must exceed that of the first two."""


@pytest.fixture(scope="module")
def config(tempering_cache):
    config = load_config(builtin_config("repo"))
    ensure_pretrained(config.pretrain, progress=False)
    return config


@pytest.mark.slow  # the config's pre-training (minutes) and two runs of 16 steps
@pytest.mark.parametrize("advantage, learns", [("grpo", True), ("learning:zeroed", False)])
def test_rl_in_the_repo_gym_lifts_the_reward_and_a_zeroed_signal_does_not(config, tmp_path, advantage, learns):
    run_dir = tmp_path / "run"
    settings = config.model_dump(mode="json")
    settings.update(run_dir=str(run_dir), algorithm={**settings["algorithm"], "advantage": advantage},
                    eval={**settings["eval"], "problems_per_task": 16}, checkpoint={"every": 0})
    summary = train(TrainConfig.model_validate(settings), progress=False)

    records = read_jsonl(run_dir / "metrics.jsonl")
    check_lift([r["reward"] for r in records], learns, LIFT, head=2, tail=6)
    for when in ("eval_before", "eval_after"):
        assert set(summary[when]["components"]["repo"]) == {"fixed", "broke_other_module", "test_runs"}
