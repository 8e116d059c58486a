"""Two arithmetic domains that differ only in what grading them costs.

The miniature model almost never solves its arithmetic, so its groups rarely vary in success
and every strategy would fall back to the static weights. Here both domains are graded by a
coin: 1 or 0 by a hash of the completion, so distinct completions of one prompt vary and the
two domains have the same learnability. ``slow_sub``'s coin sleeps ``SLEEP_S`` per rollout
first (a stand-in for a slow verifier or a sandbox service), so a rollout of it costs far
more than one of ``fast_add``.
"""

from __future__ import annotations

import time
import zlib

from tempering.tasks.arithmetic import ArithmeticTask
from tempering.types import Problem

COIN = "slow_reward:coin"
SLOW_COIN = "slow_reward:coin_slowly"
SLEEP_S = 0.1


def coin(problem: Problem, completion: str) -> float:
    return float(zlib.crc32(completion.encode()) % 2)


def coin_slowly(problem: Problem, completion: str) -> float:
    time.sleep(SLEEP_S)
    return coin(problem, completion)


def fast_add(name: str, seed: int, **options) -> ArithmeticTask:
    return ArithmeticTask(name=name, seed=seed, operation="add", rewards={COIN: 1.0}, metric=COIN, **options)


def slow_sub(name: str, seed: int, **options) -> ArithmeticTask:
    return ArithmeticTask(name=name, seed=seed, operation="sub", rewards={SLOW_COIN: 1.0}, metric=SLOW_COIN,
                          **options)
