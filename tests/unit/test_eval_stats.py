"""The estimators of sampled evaluation against brute force over every k-subset, on hand-made samples."""

import itertools
import math
import random
from fractions import Fraction

import pytest

from tempering.eval.stats import MAJ_SUBSETS, best_of_k, bootstrap_interval, maj_at_k, pass_at_k, wilson_interval


def _mean_over_subsets(n: int, k: int, value) -> float:
    subsets = list(itertools.combinations(range(n), k))
    return sum(value(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample(n):
    for c in range(n + 1):
        correct = set(range(c))
        for k in range(1, n + 1):
            brute = _mean_over_subsets(n, k, lambda s: float(bool(correct & set(s))))
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_matches_the_closed_form_where_the_binomials_are_huge():
    n, c, k = 500, 3, 250
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(10, 0, 5) == 0.0, "nothing correct"
    assert pass_at_k(10, 10, 1) == 1.0, "everything correct"
    assert pass_at_k(10, 7, 4) == 1.0, "n - c < k: every k-subset holds a correct sample"
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3), "k = 1 is the share correct"
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def _best_in_subset(scores, ranks, subset) -> float:
    top = max(ranks[i] for i in subset)
    return scores[min(i for i in subset if ranks[i] == top)]  # ties go to the earlier sample


def test_best_of_k_is_the_mean_over_k_subsets_of_the_top_ranked_samples_score():
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 7)
        scores = [rng.choice([0.0, 0.5, 1.0]) for _ in range(n)]
        ranks = [rng.choice([0.1, 0.2, 0.3]) for _ in range(n)]  # ties included
        for k in range(1, n + 1):
            brute = _mean_over_subsets(n, k, lambda s: _best_in_subset(scores, ranks, s))
            assert best_of_k(scores, ranks, k) == pytest.approx(brute, abs=1e-12), (scores, ranks, k)


def test_best_of_k_by_the_grader_itself_is_pass_at_k_for_0_1_scores():
    scores = [0, 1, 0, 0, 1, 0]
    for k in range(1, 7):
        assert best_of_k(scores, scores, k) == pytest.approx(pass_at_k(6, 2, k))


def test_maj_at_k_on_hand_made_answers():
    answers, scores = ["4", "4", "5", None], [1, 1, 0, 0]
    assert maj_at_k(answers, scores, 1) == pytest.approx(0.5), "each sample alone; no answer, no credit"
    # {0,1,2}: 4 wins; {0,1,3}: 4 wins; {0,2,3} and {1,2,3}: 4 and 5 tie, half credit
    assert maj_at_k(answers, scores, 3) == pytest.approx(3 / 4)
    assert maj_at_k(answers, scores, 4) == 1.0, "two votes for 4 beat one for 5"
    assert maj_at_k(["5", "5", "4"], [0, 0, 1], 3) == 0.0, "the majority is wrong"
    assert maj_at_k([None, None], [0, 0], 2) == 0.0, "nobody voted"


def test_maj_at_k_credits_an_answer_by_its_samples_mean_score():
    """Samples of one answer can be graded differently (a grader that reads more than the answer)."""
    assert maj_at_k(["7", "7", "8"], [1, 0, 1], 3) == pytest.approx(0.5)


def test_maj_at_k_over_too_many_subsets_uses_a_fixed_random_share_of_them():
    n, k = 20, 10
    assert math.comb(n, k) > MAJ_SUBSETS
    answers = ["right"] * 12 + ["wrong"] * 8
    scores = [1] * 12 + [0] * 8
    first = maj_at_k(answers, scores, k)
    assert first == maj_at_k(answers, scores, k), "same seed, same subsets"
    # exact: P(more 'right' than 'wrong' among 10) + half of P(5 each)
    exact = sum(math.comb(12, r) * math.comb(8, k - r) * (1 if r > 5 else 0.5 if r == 5 else 0)
                for r in range(2, 11)) / math.comb(n, k)
    assert first == pytest.approx(exact, abs=0.03)


def test_wilson_interval_holds_the_proportion_and_stays_in_0_1():
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    for successes, trials in ((0, 10), (3, 10), (50, 100), (99, 100), (1, 1)):
        low, high = wilson_interval(successes, trials)
        assert 0 <= low <= successes / trials <= high <= 1
    low, high = wilson_interval(50, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)  # the textbook value
    assert wilson_interval(500, 1000)[1] - wilson_interval(500, 1000)[0] < high - low, "more trials, narrower"


def test_bootstrap_interval_holds_the_mean_and_narrows_with_more_problems():
    rng = random.Random(1)
    few = [float(rng.random() < 0.4) for _ in range(20)]
    many = [float(rng.random() < 0.4) for _ in range(2000)]
    for values in (few, many):
        low, high = bootstrap_interval(values)
        assert low <= sum(values) / len(values) <= high
    assert bootstrap_interval(few) == bootstrap_interval(few), "a fixed seed"
    few_low, few_high = bootstrap_interval(few)
    many_low, many_high = bootstrap_interval(many)
    assert many_high - many_low < (few_high - few_low) / 4
    # a proportion's bootstrap interval is close to the normal one on many problems
    p = sum(many) / len(many)
    assert many_high - many_low == pytest.approx(2 * 1.96 * math.sqrt(p * (1 - p) / len(many)), rel=0.1)
