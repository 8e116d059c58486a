"""The estimators of sampled evaluation: pass@k, best-of-k, maj@k, and their confidence intervals.

Each estimator takes one problem's n graded samples and returns the expected value, over a
uniformly random choice of k of them, of what a user drawing k samples would get. That makes
every number comparable across n (drawing more samples than k only lowers the variance) and
k = 1 the mean sample score.

- :func:`pass_at_k`: Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)`` for c correct of n,
  computed as a product so that no binomial coefficient is formed;
- :func:`best_of_k`: the score of the sample a selector ranks highest among k; exact, from
  the probability that the i-th ranked of n is the best of a random k-subset;
- :func:`roc_auc`: how well a score separates positives from negatives (a process reward
  model's step values against its step labels);
- :func:`maj_at_k`: whether the most common extracted answer among k samples is right (a tie
  shares the credit among the tied answers, its expectation under a random tie-break;
  samples without an answer do not vote). Exact over every k-subset up to
  :data:`MAJ_SUBSETS` of them, else the mean over that many random subsets from a fixed seed.

Confidence intervals are 95%: Wilson's score interval for greedy accuracy (a proportion of
graded problems), a percentile bootstrap over problems for the sampled metrics (each
problem's value is resampled whole, so the interval counts the spread between problems and
the noise of its own n samples).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Optional

import numpy as np

MAJ_SUBSETS = 2000
"""maj@k is exact over all k-subsets of the samples when there are at most this many."""
BOOTSTRAP_RESAMPLES = 2000
Z_95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n, c of them
    correct, is correct.

    >>> pass_at_k(5, 0, 3), pass_at_k(5, 5, 1), pass_at_k(5, 3, 3)
    (0.0, 1.0, 1.0)
    >>> round(pass_at_k(4, 1, 2), 6)  # 1 - C(3,2)/C(4,2)
    0.5
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def best_of_k(scores: Sequence[float], ranks: Sequence[float], k: int) -> float:
    """Expected score of the sample with the highest ``ranks`` among k drawn from ``scores``
    (ties in ``ranks`` go to the earlier sample).

    The i-th ranked sample (from 0) is the best of a k-subset when the subset holds it and
    k - 1 of the n - 1 - i ranked below it: probability ``C(n-1-i, k-1) / C(n, k)``.

    >>> best_of_k([0, 1, 0], [0.9, 0.5, 0.1], 1), best_of_k([0, 1, 0], [0.9, 0.5, 0.1], 3)
    (0.3333333333333333, 0.0)
    """
    n = len(scores)
    if len(ranks) != n or not 1 <= k <= n:
        raise ValueError(f"best-of-k needs one rank per score and 1 <= k <= n, got n={n}, k={k}")
    order = sorted(range(n), key=lambda i: -ranks[i])  # stable: ties keep sample order
    total = math.comb(n, k)
    return sum(scores[j] * math.comb(n - 1 - i, k - 1) for i, j in enumerate(order)) / total


def _vote(answers: Sequence[Optional[Hashable]], scores: Sequence[float]) -> float:
    """The credit of one vote: the mean score of the answers tied for most votes, each answer
    scored by the mean of its samples' scores."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return 0.0
    top = max(counts.values())
    winners = [a for a, c in counts.items() if c == top]
    credit = 0.0
    for winner in winners:
        held = [s for a, s in zip(answers, scores) if a == winner]
        credit += sum(held) / len(held)
    return credit / len(winners)


def maj_at_k(answers: Sequence[Optional[Hashable]], scores: Sequence[float], k: int, seed: int = 0) -> float:
    """Expected credit of a majority vote among k of the n samples (``answers[i]`` is sample
    i's extracted answer, None for none; ``scores[i]`` its grade).

    >>> maj_at_k(["4", "4", "5"], [1, 1, 0], 3), maj_at_k(["4", "5"], [1, 0], 2)
    (1.0, 0.5)
    """
    n = len(answers)
    if len(scores) != n or not 1 <= k <= n:
        raise ValueError(f"maj@k needs one score per answer and 1 <= k <= n, got n={n}, k={k}")
    if math.comb(n, k) <= MAJ_SUBSETS:
        subsets = list(itertools.combinations(range(n), k))
    else:
        rng = random.Random(seed)
        subsets = [rng.sample(range(n), k) for _ in range(MAJ_SUBSETS)]
    return sum(_vote([answers[i] for i in s], [scores[i] for i in s]) for s in subsets) / len(subsets)


def roc_auc(scores: Sequence[float], labels: Sequence[int]) -> Optional[float]:
    """Area under the ROC curve: the chance that a random positive scores above a random
    negative, a tie counting half (the Mann-Whitney statistic); None without both classes.

    >>> roc_auc([0.9, 0.8, 0.3, 0.1], [1, 1, 0, 0]), roc_auc([0.5, 0.5], [1, 0]), roc_auc([0.2], [1])
    (1.0, 0.5, None)
    >>> roc_auc([0.1, 0.8, 0.3], [1, 1, 0])
    0.5
    """
    if len(scores) != len(labels):
        raise ValueError(f"roc_auc needs one label per score, got {len(scores)} scores and {len(labels)} labels")
    positives = sum(1 for y in labels if y)
    negatives = len(labels) - positives
    if not positives or not negatives:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):  # tied scores share the mean of their ranks (1-based)
        end = start
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = (start + end) / 2 + 1
        start = end + 1
    positive_ranks = sum(r for r, y in zip(ranks, labels) if y)
    return (positive_ranks - positives * (positives + 1) / 2) / (positives * negatives)


def wilson_interval(successes: float, trials: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for a proportion; ``(0, 1)`` with no trials.

    >>> [round(x, 4) for x in wilson_interval(5, 10)]
    [0.2366, 0.7634]
    """
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    # at p = 0 or 1 the bound is exactly 0 or 1; the formula reaches it only up to rounding
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    return low, 1.0 if successes >= trials else min(1.0, centre + half)


def bootstrap_interval(values: Sequence[float], seed: int = 0,
                       resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the mean of ``values``, resampling them whole;
    ``(0, 1)`` with none.

    >>> bootstrap_interval([0.5, 0.5, 0.5])
    (0.5, 0.5)
    """
    if not len(values):
        return 0.0, 1.0
    array = np.asarray(values, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(array), size=(resamples, len(array)))
    low, high = np.percentile(array[picks].mean(axis=1), [2.5, 97.5])
    return float(low), float(high)
