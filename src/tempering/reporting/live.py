"""What ``temper train`` shows while it runs: a progress bar with its ETA (on stderr), one
compact line per step and a per-domain table every ``logging.table_every`` steps (on stdout,
above the bar, so a log file holds them without the bar's redraws). ``--quiet`` shows none.

Everything shown is read from the step record that ``metrics.jsonl`` gets; a key a run does
not have (``kl`` without a reference model, ``eval/accuracy`` between evaluations) is left out.
"""

from __future__ import annotations

from tqdm import tqdm


def step_line(record: dict, steps: int) -> str:
    """One step in a line: reward, training accuracy, mean completion length (tokens), KL and
    entropy where the record has them, held-out accuracy when it was measured, the sandbox's
    verdicts where a reward ran programs, the domains paused for a grader that is down, seconds
    and the share of them spent on rewards.

    >>> step_line({"step": 3, "reward": 0.5, "accuracy": 0.25, "completion_length": 12.0,
    ...            "entropy": 1.2, "step_s": 2.0}, 10)
    'step 3/10  reward 0.500  acc 25.0%  len 12.0  ent 1.200  2.00 s/step'
    >>> step_line({"step": 3, "reward": 0.5, "accuracy": 0.5, "completion_length": 40.0, "step_s": 2.0,
    ...            "reward_s": 0.25, "diag/code/status/passed": 0.5, "diag/code/status/failed": 0.375,
    ...            "diag/code/status/timeout": 0.125}, 10)
    'step 3/10  reward 0.500  acc 50.0%  len 40.0  code passed 50% failed 38% timeout 12%  2.00 s/step (rewards 12%)'
    >>> step_line({"step": 4, "reward": 0.5, "accuracy": 0.5, "completion_length": 9.0, "step_s": 1.0,
    ...            "paused_domains": 1, "domain/add/paused": 0.0, "domain/code/paused": 1.0}, 10)
    'step 4/10  reward 0.500  acc 50.0%  len 9.0  paused: code  1.00 s/step'
    """
    parts = [f"step {record['step']}/{steps}", f"reward {record['reward']:.3f}", f"acc {100 * record['accuracy']:.1f}%",
             f"len {record['completion_length']:.1f}"]
    parts += [f"{label} {record[key]:.3f}" for label, key in (("kl", "kl"), ("ent", "entropy")) if key in record]
    if "eval/accuracy" in record:
        parts.append(f"eval {100 * record['eval/accuracy']:.1f}%")
    statuses: dict[str, list[str]] = {}
    for key, share in record.items():
        if key.startswith("diag/") and "/status/" in key:
            reward, _, label = key[len("diag/"):].partition("/status/")
            statuses.setdefault(reward, []).append(f"{label} {100 * share:.0f}%")
    parts += [f"{reward} {' '.join(labels)}" for reward, labels in statuses.items()]
    if record.get("paused_domains"):  # a domain whose grader is down (scheduler.pause_failing)
        paused = [key.split("/")[1] for key, value in record.items() if key.endswith("/paused") and value]
        parts.append(f"paused: {', '.join(paused)}")
    timing = f"{record['step_s']:.2f} s/step"
    if record.get("reward_s") and record["step_s"] > 0:
        timing += f" (rewards {100 * record['reward_s'] / record['step_s']:.0f}%)"
    parts.append(timing)
    return "  ".join(parts)


DOMAIN_COLUMNS = (("weight", "weight", "{:.1%}"), ("reward", "reward", "{:.3f}"), ("success", "success", "{:.1%}"),
                  ("tokens", "completion_tokens", "{:.0f}"), ("dropped", "dropped_groups", "{:.0f}"))
"""(title, key under ``domain/<name>/``, format) of each column of :func:`domain_table`."""


def domain_table(record: dict) -> str:
    """The step's per-domain numbers: mixture weight, mean reward, success rate (the
    scheduler's recent average), completion tokens and groups dropped this step.

    >>> print(domain_table({"step": 5, "domain/add/weight": 0.5, "domain/add/reward": 0.25,
    ...                     "domain/add/success": 0.125, "domain/add/completion_tokens": 40,
    ...                     "domain/add/dropped_groups": 1}))
    step 5    weight  reward  success  tokens  dropped
    add        50.0%   0.250    12.5%      40        1
    """
    domains = list(dict.fromkeys(key.split("/")[1] for key in record if key.startswith("domain/")))
    rows = [(f"step {record['step']}", *(title for title, _, _ in DOMAIN_COLUMNS))]
    for domain in domains:
        rows.append((domain, *(fmt.format(record[f"domain/{domain}/{key}"]) if f"domain/{domain}/{key}" in record
                               else "-" for _, key, fmt in DOMAIN_COLUMNS)))
    first = max(len(row[0]) for row in rows) + 2
    widths = [max(len(row[i]) for row in rows) + 2 for i in range(1, len(rows[0]))]
    return "\n".join(f"{row[0]:<{first}}" + "".join(f"{cell:>{w}}" for cell, w in zip(row[1:], widths)).rstrip()
                     for row in rows)


class LiveView:
    """The bar, the step lines and the tables of one training run."""

    def __init__(self, steps: int, first_step: int, table_every: int, enabled: bool):
        self.steps, self.table_every, self.enabled = steps, table_every, enabled
        self._bar = tqdm(total=steps, initial=first_step, desc="train", unit="step", disable=not enabled,
                         dynamic_ncols=True)

    def note(self, text: str) -> None:
        """A line above the bar, once (what the run decided at start-up)."""
        if self.enabled:
            self._bar.write(text)

    def update(self, record: dict) -> None:
        if self.enabled:
            self._bar.write(step_line(record, self.steps))
            if self.table_every and record["step"] % self.table_every == 0:
                self._bar.write(domain_table(record))
        self._bar.update()

    def close(self) -> None:
        self._bar.close()
