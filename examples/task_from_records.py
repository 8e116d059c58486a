"""A task of your own, from a list of dicts: its data, its prompt and its grading.

A task is a deterministic, indexable problem source: ``train_problem(i)`` must be the same
problem for the same seed and ``i`` (so that a resumed run continues exactly), and
``eval_problems(n)`` a held-out set that never meets the training stream. It names the
rewards that grade it and the one (``metric``) whose value counts as correct.

    python examples/task_from_records.py [key=value ...]

For records in a file (JSONL, parquet, a Hugging Face datasets folder) there is no code to
write: the built-in ``dataset`` task reads them (``tasks: [{name: dataset, options: {path: ...}}]``).
"""

import random
import sys

from tempering import Problem, register_task, train

RECORDS = [{"question": f"{a}+{b}", "answer": str(a + b)} for a in range(10, 40, 3) for b in range(11, 60, 7)]


@register_task("sums")
class SumsTask:
    """The records above; every seventh is held out."""

    def __init__(self, name: str, seed: int, records: list = RECORDS):
        self.name, self.domain, self.seed = name, name, seed
        self.rewards = {"exact_match": 1.0, "format": 0.1}
        self.metric = "exact_match"
        self.held_out = [r for i, r in enumerate(records) if i % 7 == 0]
        self.train_records = [r for i, r in enumerate(records) if i % 7 != 0]

    def _problem(self, record: dict) -> Problem:
        # raw text, the prompt form the built-in tiny model was pre-trained on ("47+38\n")
        return Problem(task=self.name, id=record["question"], prompt=record["question"] + "\n",
                       answer=record["answer"], domain=self.domain)

    def train_problem(self, index: int) -> Problem:
        epoch, position = divmod(index, len(self.train_records))
        order = list(range(len(self.train_records)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)  # a fresh order each epoch, fixed by the seed
        return self._problem(self.train_records[order[position]])

    def eval_problems(self, n: int) -> list[Problem]:
        return [self._problem(r) for r in self.held_out[:n]]


CONFIG = {"steps": 20, "tasks": [{"name": "sums"}]}

if __name__ == "__main__":
    summary = train(CONFIG, sys.argv[1:], progress=True)
    print(f"sums: held-out accuracy {summary['eval_before']['per_task']['sums']} -> "
          f"{summary['eval_after']['per_task']['sums']}")
