"""``builtin:generalist``: the small model that joint training across domains starts from.

The built-in tiny model knows column arithmetic only, so training it on many domains shows
nothing but the mixture steering away from what it cannot learn. The generalist is the same
character-level model pre-trained, offline, on a mixed corpus: the three column-arithmetic
tasks, three code families and six reasoning-gym types, each written with worked lines and,
in a share of the documents, its classic mistake (:mod:`tempering.tasks.rg_corpus`,
the tasks' own ``corpus_document``). The mistakes show only on some problems, so domains
start part right and RL has something to fix (measured starts: docs/models.md).

:func:`domains` is the one list of those domains: the pre-training corpus is written from it,
and the shipped ``joint`` config trains on the same tasks with the same options (a test keeps
them in step). The reasoning-gym types and their sizes were chosen by a screen (``bench/joint.py
--screen`` repeats it): candidates pre-trained together, kept where they started between 10%
and 70% held-out; chain_sum (7%) and letter_counting (73%) were left out.
"""

from __future__ import annotations

from typing import Any

from tempering.config import PretrainConfig, TaskSpec

# reasoning-gym types, with configs small enough for a 256-wide model of 4 layers
REASONING: dict[str, dict[str, Any]] = {
    "gcd": {"min_value": 2, "max_value": 60},
    "lcm": {"min_value": 2, "max_value": 20},
    "count_bits": {"min_n": 1, "max_n": 255},
    "count_primes": {"min_n": 1, "max_n": 60},
    "spell_backward": {"min_word_len": 3, "max_word_len": 6},
    "number_sequence": {"min_terms": 4, "max_terms": 5, "min_value": -20, "max_value": 20, "max_complexity": 1},
}

# code kinds, one family each
CODE: dict[str, str] = {"filter": "at_least", "number": "range_sum", "string": "pad_left"}

# domain groups, as bench/joint.py trains them alone
GROUPS: dict[str, list[str]] = {
    "arithmetic": ["add", "sub", "mul"],
    "code": [f"code:{kind}" for kind in CODE],
    "reasoning": [f"rg:{rg_type}" for rg_type in REASONING],
}


def domains() -> list[TaskSpec]:
    """The generalist's domains as task specs, with their options for training and evaluation."""
    specs = [TaskSpec(name=op, options={"digits": [2]}) for op in GROUPS["arithmetic"]]
    specs += [TaskSpec(name=f"code:{kind}", options={"families": [family]}) for kind, family in CODE.items()]
    specs += [TaskSpec(name=f"rg:{rg_type}", options={"style": "raw", "config": dict(config)})
              for rg_type, config in REASONING.items()]
    return specs


CODE_WRONG_SHARE = 0.9
"""Share of the odd-``k`` code documents written with the bug. At the corpus's 0.6 (0.3 of a
family's documents) the model wrote the right form where ``k`` is odd too and two families
started at 77% and 100%; near 1 the bug stays the likelier form there, and the tenth written
right keeps the right form within reach of sampling."""


def corpus_tasks() -> list[TaskSpec]:
    """:func:`domains` as the corpus writes them: a program gets twice a sum's documents, and
    its bug only where the parameter ``k`` is odd, there in :data:`CODE_WRONG_SHARE` of them (a
    bug that breaks every hidden test would otherwise be the greedy answer on every problem or
    on none)."""
    code_options = {"corpus_mistakes": "odd", "corpus_wrong_share": CODE_WRONG_SHARE}
    return [spec.model_copy(update={"weight": 2.0, "options": {**spec.options, **code_options}})
            if spec.name.startswith("code:") else spec for spec in domains()]


def recipe() -> PretrainConfig:
    """The generalist's pre-training (its cache entry is keyed by this, as builtin:tiny's is
    by the config's ``pretrain`` section). In float32: bf16 autocast would make another model
    on a CPU that computes bf16 than on one that does not (``pretrain.as_run_here``), and the
    starting accuracies the joint bench compares against are those of one model."""
    return PretrainConfig(tasks=corpus_tasks(), wrong_share=0.6, hidden_size=256, layers=4, heads=4,
                          max_positions=320, steps=1000, batch_docs=64, lr=2e-3, warmup_steps=30, bf16=False, seed=0)
