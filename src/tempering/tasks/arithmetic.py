"""Built-in procedural arithmetic tasks: column addition, subtraction and multiplication.

Each problem is solved column by column, one checkable line per column
(``7+8=15``), then a final ``answer: N`` line. The same generator writes the pre-training
corpus for the built-in tiny model, and that corpus deliberately contains a share of
*buggy* worked solutions, the classic procedural mistakes of arithmetic learners: a dropped
carry in addition and multiplication, "smaller from larger" in subtraction. A model
pre-trained on it knows the procedure and the mistake, and on problems that need a
carry or borrow it prefers the mistake: exactly the gap between knowing and doing that
RL with a verifiable reward closes.

The held-out split is a fixed hash partition of the problem space (one in
``EVAL_EVERY`` problems), so no training problem, and no pre-training document, is ever
an evaluation problem.

``style="program"`` (addition only) asks for the same procedure as a Python program that
prints the sum, one variable per column (``c1=4+3+c0//10``; the buggy variant drops the
carry term), graded by running it in the sandbox against the expected output: a code task
small enough for the built-in model, used where the reward must take real time.

``grading="lenient"`` grades the answer a reader would take (the last number when there is
no ``answer:`` line), for chat models that know some arithmetic but not the format; the
format is then left to the ``format`` reward. ``template`` rewrites a chat prompt, e.g.
``"What is {a} {op} {b}? End with a line 'answer: N'."``.

Not done here: negative results, multi-digit multipliers, division, programs for sub/mul.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from tempering.envs.tools import calc_transcript
from tempering.tasks.base import StreamState, check_grading, register_task, render
from tempering.types import Problem, domain_of

EVAL_EVERY = 8
"""One problem in EVAL_EVERY (by a stable hash) is held out for evaluation."""

Solver = Callable[[int, int, bool], tuple[list[str], int]]


def _digits(n: int, width: int) -> list[int]:
    """Digits of n, least significant first, padded to width."""
    return [(n // 10**i) % 10 for i in range(width)]


def _assemble(column_values: list[int]) -> int:
    """Number written from per-column results: last digit of each, the top column in full."""
    *low, top = column_values
    return int(str(top) + "".join(str(v % 10) for v in reversed(low)))


def solve_add(a: int, b: int, buggy: bool) -> tuple[list[str], int]:
    """Column addition; the buggy variant forgets every carry.

    >>> solve_add(47, 38, buggy=False)
    (['7+8=15', '4+3+1=8'], 85)
    >>> solve_add(47, 38, buggy=True)
    (['7+8=15', '4+3=7'], 75)
    """
    width = max(len(str(a)), len(str(b)))
    lines, values, carry = [], [], 0
    for da, db in zip(_digits(a, width), _digits(b, width)):
        total = da + db + carry
        lines.append(f"{da}+{db}+1={total}" if carry else f"{da}+{db}={total}")
        values.append(total)
        carry = 0 if buggy else total // 10
    return lines, _assemble(values)


def solve_sub(a: int, b: int, buggy: bool) -> tuple[list[str], int]:
    """Column subtraction of b <= a; the buggy variant subtracts the smaller digit from the larger.

    >>> solve_sub(52, 17, buggy=False)
    (['12-7=5', '4-1=3'], 35)
    >>> solve_sub(52, 17, buggy=True)
    (['7-2=5', '5-1=4'], 45)
    """
    width = len(str(a))
    lines, out, borrow = [], [], 0
    for da, db in zip(_digits(a, width), _digits(b, width)):
        if buggy:
            top, bottom = max(da, db), min(da, db)
        else:
            top, bottom = da - borrow, db
            borrow = int(top < bottom)
            top += 10 * borrow
        lines.append(f"{top}-{bottom}={top - bottom}")
        out.append(top - bottom)
    return lines, int("".join(str(d) for d in reversed(out)))


def solve_mul(a: int, b: int, buggy: bool) -> tuple[list[str], int]:
    """Multiplication by one digit b; the buggy variant forgets every carry.

    >>> solve_mul(47, 6, buggy=False)
    (['7*6=42', '4*6+4=28'], 282)
    >>> solve_mul(47, 6, buggy=True)
    (['7*6=42', '4*6=24'], 242)
    """
    lines, values, carry = [], [], 0
    for da in _digits(a, len(str(a))):
        product = da * b + carry
        lines.append(f"{da}*{b}+{carry}={product}" if carry else f"{da}*{b}={product}")
        values.append(product)
        carry = 0 if buggy else product // 10
    return lines, _assemble(values)


def add_program(a: int, b: int, buggy: bool) -> str:
    """Column addition as a program; the buggy variant forgets every carry.

    >>> print(add_program(47, 38, buggy=False))
    c0=7+8
    c1=4+3+c0//10
    print(c1*10+c0%10)
    >>> print(add_program(47, 38, buggy=True).splitlines()[1])
    c1=4+3
    """
    width = max(len(str(a)), len(str(b)))
    lines = []
    for i, (da, db) in enumerate(zip(_digits(a, width), _digits(b, width))):
        carry = "" if i == 0 or buggy else f"+c{i - 1}//10"
        lines.append(f"c{i}={da}+{db}{carry}")
    top = width - 1
    terms = [f"c{top}" + (f"*{10**top}" if top else "")]
    terms += [f"c{i}%10" + (f"*{10**i}" if i else "") for i in range(top - 1, -1, -1)]
    lines.append(f"print({'+'.join(terms)})")
    return "\n".join(lines)


def _draw_add(rng: random.Random, digits: int) -> tuple[int, int]:
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    return rng.randint(lo, hi), rng.randint(lo, hi)


def _draw_sub(rng: random.Random, digits: int) -> tuple[int, int]:
    a, b = _draw_add(rng, digits)
    return max(a, b), min(a, b)


def _draw_mul(rng: random.Random, digits: int) -> tuple[int, int]:
    return rng.randint(10 ** (digits - 1), 10**digits - 1), rng.randint(2, 9)


@dataclass(frozen=True)
class Operation:
    symbol: str
    solve: Solver
    draw: Callable[[random.Random, int], tuple[int, int]]
    instruction: str


OPERATIONS = {
    "add": Operation("+", solve_add, _draw_add, "Add the numbers column by column"),
    "sub": Operation("-", solve_sub, _draw_sub, "Subtract the numbers column by column"),
    "mul": Operation("*", solve_mul, _draw_mul, "Multiply column by column"),
}


@dataclass
class ArithmeticTask(StreamState):
    """Column arithmetic of ``digits``-digit numbers (one size drawn per problem).

    ``style="raw"`` prompts are ``"47+38\\n"``, for the built-in character-level model;
    ``style="chat"`` prompts are chat messages with an instruction, for chat models.
    ``corpus_lucky_share``: the share of the corpus's buggy solutions that end with the right
    answer anyway (:meth:`lucky_solution`), so that a model pre-trained on it sometimes reaches
    a right answer after wrong steps, which an outcome reward pays in full and a process reward
    does not; 0 (the default) writes none and leaves the corpus as it was.
    """

    name: str
    seed: int
    operation: str = "add"
    digits: list[int] = field(default_factory=lambda: [2])
    style: str = "raw"
    domain: str = ""
    rewards: dict[str, float] = field(default_factory=lambda: {"exact_match": 1.0, "format": 0.1})
    metric: str = "exact_match"
    grading: str = "strict"
    template: str = ""
    corpus_lucky_share: float = 0.0

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {sorted(OPERATIONS)}, got {self.operation!r}")
        if not 0 <= self.corpus_lucky_share <= 1:
            raise ValueError(f"corpus_lucky_share must be between 0 and 1, got {self.corpus_lucky_share!r}")
        if not self.digits or any(not 1 <= d <= 6 for d in self.digits):
            raise ValueError(f"digits must be a non-empty list of sizes 1..6, got {self.digits!r}")
        if self.style not in ("raw", "chat", "program"):
            raise ValueError(f"style must be 'raw', 'chat' or 'program', got {self.style!r}")
        if self.style == "program":
            if self.operation != "add":
                raise ValueError("style='program' is available for add only")
            if self.rewards == {"exact_match": 1.0, "format": 0.1}:
                self.rewards = {"code": 1.0}
            if self.metric == "exact_match":
                self.metric = "code"
        check_grading(self.grading)
        if self.template and self.style != "chat":
            raise ValueError("template rewrites chat prompts; set style: chat")
        self.domain = domain_of(self.name, self.domain)
        self._op = OPERATIONS[self.operation]
        if self.template:
            self._render(1, 2)  # a bad placeholder fails here, naming itself, not in the first step

    def _render(self, a: int, b: int) -> str:
        return render(self.template, a=a, b=b, op=self._op.symbol, expression=f"{a}{self._op.symbol}{b}")

    def _is_eval(self, a: int, b: int) -> bool:
        return zlib.crc32(f"{self.operation}:{a}:{b}".encode()) % EVAL_EVERY == 0

    def _draw(self, rng: random.Random, want_eval: bool) -> tuple[int, int]:
        while True:
            a, b = self._op.draw(rng, rng.choice(self.digits))
            if self._is_eval(a, b) == want_eval:
                return a, b

    def _problem(self, a: int, b: int) -> Problem:
        expression = f"{a}{self._op.symbol}{b}"
        _, answer = self._op.solve(a, b, False)
        if self.style == "raw":
            prompt = f"{expression}\n"
        elif self.style == "program":
            return Problem(task=self.name, id=expression, prompt=f"py {expression}\n", answer=str(answer),
                           domain=self.domain, meta={"a": a, "b": b, "code_fenced": False, "tests": {
                               "kind": "stdio", "cases": [{"stdin": "", "stdout": f"{answer}\n"}]}})
        elif self.template:
            prompt = [{"role": "user", "content": self._render(a, b)}]
        else:
            prompt = [{"role": "user", "content": (
                f"{self._op.instruction}: {expression}. Write one line per column, "
                "like 7+8=15, then finish with a line 'answer: N'."
            )}]
        return Problem(task=self.name, id=expression, prompt=prompt, answer=str(answer),
                       domain=self.domain, meta={"a": a, "b": b, "grading": self.grading})

    def train_problem(self, index: int) -> Problem:
        rng = random.Random(f"{self.seed}:{self.name}:{index}")
        self._served(index)
        return self._problem(*self._draw(rng, want_eval=False))

    def eval_problems(self, n: int) -> list[Problem]:
        rng = random.Random(f"eval:{self.name}:{self.operation}")
        seen: dict[tuple[int, int], None] = {}
        for _ in range(50 * n):  # bounded: small problem spaces yield fewer than n
            if len(seen) >= n:
                break
            seen.setdefault(self._draw(rng, want_eval=True))
        return [self._problem(a, b) for a, b in seen]

    def solution(self, problem: Problem, buggy: bool = False) -> str:
        """The worked solution text for a problem (what the model should write after the prompt)."""
        if self.style == "program":
            return add_program(problem.meta["a"], problem.meta["b"], buggy)
        lines, answer = self._op.solve(problem.meta["a"], problem.meta["b"], buggy)
        return "\n".join(lines + [f"answer: {answer}"])

    def lucky_solution(self, problem: Problem) -> str:
        """The classic mistake's steps, then the right answer, which does not follow from them:
        a right answer reached through wrong reasoning where a carry or borrow is needed, the
        right solution elsewhere.

        >>> task = ArithmeticTask(name="add", seed=0)
        >>> problem = Problem(task="add", id="47+38", prompt="47+38\\n", answer="85", meta={"a": 47, "b": 38})
        >>> task.lucky_solution(problem)
        '7+8=15\\n4+3=7\\nanswer: 85'
        """
        steps, _ = self._op.solve(problem.meta["a"], problem.meta["b"], True)
        return "\n".join(steps + [f"answer: {problem.answer}"])

    def corpus_document(self, index: int, wrong_share: float, tool_share: float = 0.0) -> str:
        """A pre-training document: a training problem and a worked solution that is buggy
        with probability ``wrong_share`` (visible only where a carry or borrow is needed),
        or, with probability ``tool_share``, a calculator call whose result is the answer
        (so a model knows the ``tools`` environment's calculator before RL asks it to use it)."""
        problem = self.train_problem(index)
        rng = random.Random(f"corpus:{self.seed}:{self.name}:{index}")
        prompt = problem.prompt if isinstance(problem.prompt, str) else f"{problem.id}\n"
        buggy = rng.random() < wrong_share
        lucky = buggy and self.corpus_lucky_share > 0 and rng.random() < self.corpus_lucky_share
        if self.style != "program" and rng.random() < tool_share:
            return f"{prompt}{calc_transcript(problem.id, problem.answer)}\nanswer: {problem.answer}"
        if lucky and self.style != "program":
            return prompt + self.lucky_solution(problem)
        return prompt + self.solution(problem, buggy)


for _operation in OPERATIONS:
    register_task(_operation)(partial(ArithmeticTask, operation=_operation))  # a partial keeps the typed signature
