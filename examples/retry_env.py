"""A multi-turn environment of your own: the model may try again after a wrong answer.

An environment turns one problem into an episode. ``reset`` gives the first prompt; after
each model turn ``step`` reads the turn's text and answers with a :class:`~tempering.Step`:
what the model sees next (text, or chat messages), the turn's rewards (added to the
episode's reward as ``env/<name>``), counters for the logs, and whether the episode is over.
The runner keeps the model's sampled tokens exactly and never trains on the environment's.
The task's own rewards still grade the episode's last turn.

    python examples/retry_env.py [key=value ...]
"""

import re
import sys

from tempering import Problem, Step, register_env, train


@register_env("retry")
class RetryEnv:
    """Up to ``env.max_turns`` tries at an arithmetic problem; a right answer earns
    ``first_try_bonus`` on the first turn, less on later ones."""

    stop = ()  # a turn ends at end-of-sequence; a tool environment would stop at its call's closing tag

    def __init__(self, first_try_bonus: float = 0.5):
        self.bonus = first_try_bonus
        self.problem: Problem | None = None
        self.turns = 0

    def reset(self, problem: Problem):
        self.problem, self.turns = problem, 0
        return problem.prompt

    def step(self, completion: str) -> Step:
        self.turns += 1
        found = re.search(r"answer:\s*(-?\d+)", completion)
        if found and found.group(1) == self.problem.answer:
            return Step(done=True, rewards={"bonus": self.bonus / self.turns})
        # chat messages start a new turn (rendered with the chat template, or one per line without one)
        return Step(observation=[{"role": "user", "content": "Not right. Try again."}], info={"retries": 1})


CONFIG = {
    "steps": 20,
    "tasks": [{"name": "add", "options": {"digits": [2]},
               "env": {"name": "retry", "max_turns": 3, "options": {"first_try_bonus": 0.5}}}],
}

if __name__ == "__main__":
    summary = train(CONFIG, sys.argv[1:], progress=True)
    print(f"held-out accuracy {summary['eval_before']['accuracy']} -> {summary['eval_after']['accuracy']}")
