"""Per-domain balance: the ``grpo_domain`` estimator scales each domain's advantages to unit size."""

import torch

from tempering.algorithms import ADVANTAGES, AdvantageInputs
from tempering.train import make_batch
from tempering.types import Group, Problem, Rollout


def test_a_domain_with_ten_times_the_reward_scale_gets_the_same_advantage_scale():
    rewards_B = torch.tensor([0., 1., 1., 0., 0., 10., 10., 0.])
    inputs = AdvantageInputs(rewards_B, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), torch.ones(8, 3),
                             domain_B=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    advantages_BT = ADVANTAGES["grpo_domain"](inputs)
    assert torch.allclose(advantages_BT[:4], advantages_BT[4:], atol=1e-5)
    assert torch.allclose(advantages_BT[:, 0], advantages_BT[:, 2])


def test_within_a_domain_small_group_differences_stay_small():
    """GRPO would give both groups unit advantages; per domain the 0.1 gap stays 10x smaller."""
    inputs = AdvantageInputs(torch.tensor([0., 1., 0.45, 0.55]), torch.tensor([0, 0, 1, 1]), torch.ones(4, 1),
                             domain_B=torch.zeros(4, dtype=torch.long))
    advantages_B = ADVANTAGES["grpo_domain"](inputs)[:, 0]
    assert torch.isclose(advantages_B[1] / advantages_B[3], torch.tensor(10.0))
    assert torch.isclose(ADVANTAGES["grpo"](inputs)[1, 0], ADVANTAGES["grpo"](inputs)[3, 0], atol=1e-4)


def test_the_loop_passes_each_rollouts_domain():
    seen = {}

    def spy(inputs):
        seen["domain_B"] = inputs.domain_B
        return torch.zeros_like(inputs.mask_BT, dtype=torch.float32)

    groups = []
    for task in ("a", "b", "a"):
        problem = Problem(task=task, id="0", prompt="", answer="")
        groups.append(Group(problem, [Rollout(problem, [1], [2], [0.0], "", "stop", 0) for _ in range(2)]))
    make_batch(groups, spy, pad_id=0)
    assert seen["domain_B"].tolist() == [0, 0, 1, 1, 0, 0]


def test_balance_and_cap_options_run_through_training_steps(tiny_model_dir, tmp_path):
    import json

    from tempering.config import load_config
    from tempering.train import train

    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    config = load_config("quickstart", [
        "steps=2", "threads=1", f"run_dir={tmp_path}", f"pretrain={json.dumps(pretrain)}",
        "rollout.prompts_per_step=6", "rollout.group_size=2", "rollout.max_new_tokens=16",
        "eval.problems_per_task=2", "eval.max_new_tokens=16", "scheduler.balance_tokens=true",
        "scheduler.max_domain_token_share=0.34", "algorithm.advantage=grpo_domain"])
    train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("capped_groups" in r for r in records)
