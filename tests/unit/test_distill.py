"""On-policy distillation: the ``distill`` advantage on hand-computed inputs, the teacher's
config and loading, and a student equal to its teacher getting no signal from real samples."""

import copy

import pytest
import torch

from tempering.algorithms import ADVANTAGES, AdvantageInputs
from tempering.algorithms.advantages import distill, needs_teacher
from tempering.build import build_learner, build_tasks, load_teacher, resolve_algorithm, rollout_worker
from tempering.config import ConfigError, load_config
from tempering.learner.forward import token_logprobs
from tempering.models.tiny import build_model
from tempering.train import make_batch

MASK_BT = torch.tensor([[0.0, 1.0, 1.0, 1.0],
                        [0.0, 1.0, 0.0, 1.0]])
STUDENT_BT = torch.tensor([[0.0, -0.1, -2.0, -0.7],
                           [0.0, -1.0, -4.0, -0.2]])
TEACHER_BT = torch.tensor([[0.0, -0.1, -0.5, -3.0],
                           [0.0, -2.5, -9.0, -0.2]])


def _inputs(rewards_B=(1.0, 0.0), task_weight=0.0) -> AdvantageInputs:
    return AdvantageInputs(torch.tensor(rewards_B), torch.tensor([0, 0]), MASK_BT, logprobs_BT=STUDENT_BT,
                           teacher_logprobs_BT=TEACHER_BT, task_weight=task_weight)


def test_distill_advantage_is_the_teachers_log_prob_minus_the_students_on_each_trained_token():
    advantages_BT = distill(_inputs())

    # teacher - student where the mask is 1: row 0: 0, -0.5 + 2 = 1.5, -3 + 0.7 = -2.3;
    # row 1: -2.5 + 1 = -1.5, (masked hole), -0.2 + 0.2 = 0
    expected_BT = torch.tensor([[0.0, 0.0, 1.5, -2.3],
                                [0.0, -1.5, 0.0, 0.0]])
    torch.testing.assert_close(advantages_BT, expected_BT, atol=1e-6, rtol=0)


def test_distill_adds_the_task_rewards_grpo_advantage_times_task_weight():
    advantages_BT = distill(_inputs(rewards_B=(1.0, 0.0), task_weight=0.5))

    # GRPO on rewards 1, 0: mean 0.5, unbiased std √0.5, advantage ±0.5 / (√0.5 + 1e-6) = ±0.70710578,
    # times 0.5 = ±0.35355289, on every trained token of the row
    g = 0.5 * 0.7071057811879616
    expected_BT = torch.tensor([[0.0, 0.0 + g, 1.5 + g, -2.3 + g],
                                [0.0, -1.5 - g, 0.0, 0.0 - g]])
    torch.testing.assert_close(advantages_BT, expected_BT, atol=1e-6, rtol=0)


def test_distill_without_a_teachers_log_probs_is_refused():
    with pytest.raises(ValueError, match="teacher_logprobs_BT"):
        distill(AdvantageInputs(torch.zeros(2), torch.tensor([0, 0]), MASK_BT, logprobs_BT=STUDENT_BT))


def test_only_distill_asks_for_a_teacher():
    assert [name for name, fn in ADVANTAGES.items() if needs_teacher(fn)] == ["distill"]


@pytest.mark.parametrize("overrides, expected", [
    (["algorithm.advantage=distill"], "algorithm.advantage=distill distils from a teacher: set algorithm.teacher.path"),
    (["algorithm.teacher.path=builtin:tiny"], "algorithm.teacher.path is set but algorithm.advantage=grpo uses no teacher"),
])
def test_a_teacher_without_distill_or_distill_without_a_teacher_is_refused(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        resolve_algorithm(load_config(None, overrides))


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_key(tiny_policy, tmp_path):
    _, tokenizer = tiny_policy
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<think>"])
    model = build_model(vocab_size=len(other), hidden_size=16, layers=1, heads=2, max_positions=64, seed=0,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model.save_pretrained(tmp_path)
    other.save_pretrained(tmp_path)
    config = load_config(None, ["algorithm.advantage=distill", f"algorithm.teacher.path={tmp_path}"])

    with pytest.raises(ConfigError) as caught:
        load_teacher(config, tokenizer, progress=False)
    message = str(caught.value)
    assert f"algorithm.teacher.path={tmp_path}: its tokenizer is not the policy's" in message
    assert "'<think>' is id 100 for the teacher, missing for the policy" in message


def test_a_missing_teacher_is_a_config_error_naming_the_key(tiny_policy, tmp_path):
    config = load_config(None, ["algorithm.advantage=distill", f"algorithm.teacher.path={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match=r"algorithm.teacher.path=.*nope: model path .* does not exist"):
        load_teacher(config, tiny_policy[1], progress=False)


def test_a_student_identical_to_its_teacher_gets_no_distillation_signal(tiny_policy):
    """Real samples of the miniature model, scored by a copy of itself: the sampler's log-probs
    and the teacher pass's agree, so every advantage and the measured reverse KL are 0 (up to
    the float error between decoding with a cache and one pass over the whole rows)."""
    model, tokenizer = tiny_policy
    config = load_config(None, ["algorithm.advantage=distill", "algorithm.teacher.path=builtin:tiny", "threads=1",
                                "rollout.prompts_per_step=3", "rollout.group_size=4", "rollout.max_new_tokens=16"])
    student = copy.deepcopy(model)
    learner = build_learner(student, config, resolve_algorithm(config), teacher=copy.deepcopy(model))
    task = build_tasks(config)[0]
    groups = rollout_worker(config, student, tokenizer).sample([task.train_problem(i) for i in range(3)])
    for rollout in (r for g in groups for r in g.rollouts):
        rollout.reward = 0.0

    batch = make_batch(groups, ADVANTAGES["distill"], tokenizer.pad_token_id, learner)

    assert batch.loss_mask_BT.sum() > 12, "the samples have trained tokens"
    assert batch.advantages_BT.abs().max() < 1e-4
    assert abs(learner.step(batch)["teacher_kl"]) < 1e-5


def test_a_teacher_whose_logits_are_not_plain_gets_its_log_probs_from_its_own_logits(tiny_policy):
    """The policy computes log-probs in chunks from hidden states; a teacher whose config scales
    its logits cannot, and is run on its whole logits instead of failing mid-run."""
    model, tokenizer = tiny_policy
    config = load_config(None, ["algorithm.advantage=distill", "algorithm.teacher.path=builtin:tiny", "threads=1",
                                "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8"])
    teacher = copy.deepcopy(model)
    teacher.config.logit_scale = 2.0  # Llama ignores it, so its log-probs stay the plain ones
    learner = build_learner(copy.deepcopy(model), config, resolve_algorithm(config), teacher=teacher)
    task = build_tasks(config)[0]
    groups = rollout_worker(config, model, tokenizer).sample([task.train_problem(i) for i in range(2)])
    batch = make_batch(groups, ADVANTAGES["grpo"], tokenizer.pad_token_id)

    teacher_BT = learner.teacher_logprobs(batch)

    assert learner.settings.logprob_chunk > 0
    expected_BT = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT)[0] * batch.loss_mask_BT
    torch.testing.assert_close(teacher_BT, expected_BT, atol=1e-5, rtol=0)
