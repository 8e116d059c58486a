"""A reward of your own, written in Python and registered with a decorator.

The built-in ``add`` task is trained on its own reward (``exact_match``) plus ``concise``,
defined here: 1 for a completion within ``max_chars`` characters, falling to 0 at twice that.
The reward's keyword-only parameters are its options (``rewards.options.concise``). Every
component is logged per step as ``reward/<name>``.

    python examples/reward_in_python.py [key=value ...]

The same function plugs in without the decorator as ``reward_in_python:concise`` in a
config file, which is what Ray workers in other processes need.
"""

import sys

from tempering import Problem, register_reward, train


@register_reward("concise")
def concise(problem: Problem, completion: str, *, max_chars: int = 40) -> float:
    """1 up to ``max_chars`` characters, then linearly down to 0 at twice as many.

    >>> concise(Problem(task="t", id="0", prompt="", answer=""), "x" * 60)
    0.5
    """
    excess = max(0, len(completion) - max_chars)
    return max(0.0, 1.0 - excess / max_chars)


CONFIG = {
    "steps": 20,
    "tasks": [{"name": "add", "options": {"digits": [2]}, "rewards": {"exact_match": 1.0, "concise": 0.2}}],
    "rewards": {"options": {"concise": {"max_chars": 40}}},
}

if __name__ == "__main__":
    summary = train(CONFIG, sys.argv[1:], progress=True)
    print(f"held-out accuracy {summary['eval_before']['accuracy']} -> {summary['eval_after']['accuracy']}")
