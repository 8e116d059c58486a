"""DAPO's data techniques: dynamic sampling, overlong filtering and soft overlong punishment."""

import math

import pytest

from tempering.algorithms.dapo import collect_groups, has_signal, mask_truncated, overlong_penalty
from tempering.config import AlgorithmConfig
from tempering.train import shape_overlong
from tempering.types import Group, Problem, Rollout, Round, Turn

PROBLEM = Problem(task="t", id="0", prompt="", answer="")


def _rollout(reward=0.0, length=2, finish_reason="stop"):
    return Rollout(PROBLEM, [1], [5] * length, [-0.5] * length, "", finish_reason, 0, reward=reward)


class Source:
    """Hands out pre-made rounds of groups, given as rewards per group, each with its reward
    mean and costs (round i took i + 1 seconds to sample, 0.5 to score, staleness i)."""

    def __init__(self, rounds):
        self.rounds = [[Group(PROBLEM, [_rollout(r) for r in rewards]) for rewards in groups] for groups in rounds]
        self.asked = 0

    def next_round(self):
        groups = self.rounds[self.asked]
        rollouts = [r for g in groups for r in g.rollouts]
        made = Round(groups, {"reward": sum(r.reward for r in rollouts) / len(rollouts)}, version=0,
                     generate_s=self.asked + 1.0, reward_s=0.5, sync_s=0.25, staleness=self.asked)
        self.asked += 1
        return made


def test_without_dynamic_sampling_one_round_is_kept_whole_and_flat_groups_are_counted():
    source = Source([[[1, 1], [1, 0], [0, 0]]])
    groups, record = collect_groups(source.next_round, 3, dynamic=False, max_extra_rounds=5)
    assert source.asked == 1
    assert len(groups) == 3
    # two of three groups are flat; none dropped; mean reward (2 + 1 + 0) / 6
    assert record["zero_signal_fraction"] == pytest.approx(2 / 3)
    assert (record["dropped_groups"], record["dropped_fraction"], record["sampling_rounds"]) == (0, 0.0, 1)
    assert record["reward"] == pytest.approx(0.5)
    assert record["completion_tokens"] == 6 * 2
    assert record["completion_length"] == 2


def test_dynamic_sampling_drops_flat_groups_and_samples_until_the_batch_is_full():
    source = Source([
        [[1, 1], [1, 0], [0, 0]],  # round 1: one group with signal
        [[0, 0], [0, 0], [0, 0]],  # round 2: none
        [[0, 1], [1, 1], [1, 0]],  # round 3: two more; the batch of 3 is full, the surplus unused
        [[0, 1], [0, 1], [0, 1]],  # never asked for
    ])
    groups, record = collect_groups(source.next_round, 3, dynamic=True, max_extra_rounds=5)
    assert source.asked == 3
    assert [[r.reward for r in g.rollouts] for g in groups] == [[1, 0], [0, 1], [1, 0]]
    # 9 groups sampled; flat, so dropped: 2 in round 1, 3 in round 2, 1 in round 3
    assert record["dropped_groups"] == 2 + 3 + 1
    assert record["dropped_fraction"] == pytest.approx(6 / 9)
    assert record["zero_signal_fraction"] == pytest.approx(6 / 9)
    assert record["sampling_rounds"] == 3
    # mean reward over all 18 sampled rollouts: (2 + 1 + 0) + 0 + (1 + 2 + 1) = 7
    assert record["reward"] == pytest.approx(7 / 18)
    # the step's costs are its rounds' sums (1 + 2 + 3 s sampling), its staleness the largest
    assert (record["generate_s"], record["reward_s"], record["weight_sync_s"]) == (6.0, 1.5, 0.75)
    assert record["staleness"] == 2


def test_dynamic_sampling_stops_after_the_extra_rounds_with_a_smaller_batch():
    source = Source([[[1, 0], [1, 1]], [[0, 0], [1, 1]], [[0, 0], [0, 0]]])
    groups, record = collect_groups(source.next_round, 2, dynamic=True, max_extra_rounds=1)
    assert source.asked == 2, "one first round and one extra round"
    assert len(groups) == 1
    assert record["dropped_groups"] == 3 and record["dropped_fraction"] == pytest.approx(3 / 4)


def test_when_no_group_has_signal_the_last_round_is_trained_on_as_it_is():
    source = Source([[[1, 1]], [[0, 0]]])
    groups, record = collect_groups(source.next_round, 1, dynamic=True, max_extra_rounds=1)
    assert [[r.reward for r in g.rollouts] for g in groups] == [[0, 0]]
    # the first round's group was dropped; the last round's is used, so not counted as dropped
    assert record["dropped_groups"] == 1 and record["dropped_fraction"] == pytest.approx(1 / 2)


def _empty_round(record):
    return Round([], record, version=0, generate_s=0.5, reward_s=0.0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_round_with_no_groups_gives_an_empty_batch_and_a_record_without_nan(dynamic):
    # no groups: nothing to keep, no fraction of nothing (0/0 was a ZeroDivisionError), no mean of nothing;
    # with dynamic sampling the extra round is empty too and then the rounds run out
    rounds = iter([_empty_round({"reward/dropped": 4.0}), _empty_round({})])
    groups, record = collect_groups(lambda: next(rounds), 2, dynamic=dynamic, max_extra_rounds=1)
    assert groups == []
    assert all(math.isfinite(value) for value in record.values()), record
    assert (record["dropped_groups"], record["dropped_fraction"], record["zero_signal_fraction"]) == (0, 0.0, 0.0)
    assert (record["completion_tokens"], record["completion_length"]) == (0, 0.0)
    assert record["sampling_rounds"] == (2 if dynamic else 1)
    assert record["generate_s"] == (1.0 if dynamic else 0.5)
    assert "reward/dropped" not in record, "a mean over no rollouts is left out, not made 0"


def test_an_empty_round_adds_nothing_to_the_means_of_the_rounds_with_rollouts():
    # an empty round's record may hold NaN (the mean of nothing): weighted by its 0 rollouts it made
    # the step's mean NaN; the batch and means are the next round's
    source = Source([[[1, 0], [1, 1]]])
    rounds = iter([_empty_round({"reward": float("nan")})])
    groups, record = collect_groups(lambda: next(rounds, None) or source.next_round(), 1, dynamic=True,
                                    max_extra_rounds=2)
    assert [[r.reward for r in g.rollouts] for g in groups] == [[1, 0]]
    assert record["reward"] == pytest.approx(3 / 4)
    assert record["sampling_rounds"] == 2 and record["zero_signal_fraction"] == pytest.approx(1 / 2)


def test_has_signal_needs_two_different_rewards():
    assert not has_signal(Group(PROBLEM, [_rollout(0.3)]))
    assert has_signal(Group(PROBLEM, [_rollout(0.3), _rollout(0.3), _rollout(0.31)]))


def test_mask_truncated_zeroes_the_loss_mask_of_length_limited_completions_only():
    rollouts = [_rollout(length=3, finish_reason="length"), _rollout(length=2, finish_reason="stop")]
    assert mask_truncated(rollouts) == 1
    assert [r.loss_mask for r in rollouts] == [[0, 0, 0], [1, 1]]


def test_overlong_penalty_falls_linearly_over_the_buffer():
    # limit 20, buffer 8: no penalty up to 12 tokens, then -(length - 12) / 8 * 0.5 down to -0.5
    assert [overlong_penalty(n, 20, 8, 0.5) for n in (5, 12, 13, 16, 20, 25)] == pytest.approx(
        [0.0, 0.0, -0.0625, -0.25, -0.5, -0.5])
    assert overlong_penalty(20, 20, 0) == 0.0, "buffer 0 turns it off"


def test_shape_overlong_penalises_rewards_then_masks_truncated_completions():
    rollouts = [_rollout(1.0, length=10, finish_reason="length"), _rollout(1.0, length=7), _rollout(0.0, length=4)]
    groups = [Group(PROBLEM, rollouts)]
    config = AlgorithmConfig(overlong_filter=True, overlong_buffer=4, overlong_penalty=1.0)

    record = shape_overlong(groups, config, max_new_tokens=10)

    # limit 10, buffer 4: length 10 -> -1, length 7 -> -(7 - 6) / 4 = -0.25, length 4 -> 0
    assert [r.reward for r in rollouts] == pytest.approx([0.0, 0.75, 0.0])
    assert [sum(r.loss_mask) for r in rollouts] == [0, 7, 4]
    assert record == pytest.approx({"truncated_fraction": 1 / 3, "overlong_penalty": 1.25 / 3})


def test_shape_overlong_is_a_no_op_by_default():
    rollouts = [_rollout(1.0, length=10, finish_reason="length")]
    record = shape_overlong([Group(PROBLEM, rollouts)], AlgorithmConfig(), max_new_tokens=10)
    assert rollouts[0].reward == 1.0 and rollouts[0].loss_mask == [1] * 10
    assert record == {"truncated_fraction": 1.0, "overlong_penalty": 0.0}


def test_shape_overlong_judges_an_episode_by_its_longest_model_turn():
    """Two turns of 6 and 7 model tokens around 5 environment tokens: 18 tokens in all, but no
    turn came near the 10-token limit of a turn but the second (7 -> -0.25)."""
    episode = _rollout(1.0, length=18)
    episode.turns = [Turn("a", 0, 6, "stop", "obs", [9] * 5), Turn("b", 11, 18, "stop")]
    episode.loss_mask = [1] * 6 + [0] * 5 + [1] * 7
    shape_overlong([Group(PROBLEM, [episode])], AlgorithmConfig(overlong_buffer=4), max_new_tokens=10)
    assert episode.reward == pytest.approx(0.75)
