"""``builtin:tiny-long``: the small model that long-context RL starts from.

The built-in tiny model reads 256 positions and knows arithmetic; the generalist reads 320.
builtin:tiny-long is the same character-level Llama, narrower (128 wide, 2 layers, so that a
4,096-character document costs seconds, not tens of seconds, forward and backward on one
core), with room for 8,320 positions, pre-trained offline on ``long_context`` documents
(:data:`CORPUS`): retrieval of a code whose value was changed later in the document. Its positions are
rotary, so lengths past the longest trained one can be read without new weights
(extrapolation, which the shipped ``long`` config evaluates).

The corpus is a length curriculum (the task's ``corpus_docs``): most documents at the
shortest length, where the lookup is learned cheaply, then fewer and fewer at each doubling up
to :data:`LONGEST`, with steps of an even token count (``batch_tokens``), so each long document
is a step of its own. What makes the lookup form at all (``bench/tiny_long_copy.py``, and
docs/models.md for the measures): on documents alone, four answer digits in a few hundred
characters, the answer stayed at chance in every try; :data:`COPY_ROWS` rows a step that repeat
a random string (``pretrain.copy_rows``), a loss that leans on the answer
(:data:`CONTEXT_WEIGHT`), a learning rate held at its peak through the shortest documents
(the copy forms after a plateau of about 1,500 steps, when a cosine rate has already fallen)
and every answer right, retrieval alone, make it form. The rate then falls (cosine, to a tenth)
over the longer lengths: at the peak rate there, one long document a step, the lookup formed
at 256 was lost (81% of held-out values teacher-forced at the end of the 256 stage, 3% at
the end of the curriculum). The corpus is retrieval alone, answered right: with half the
answers stale and a chained lookup in one document of four, the same copy rows did not make
the lookup form in 2,700 steps. As measured (docs/models.md) the lookup holds at 256
characters (78% of values teacher-forced) and fades with length (22% at 1,024, 0% at 4,096),
and it is a lookup of the latest change, not of the asked name: with another name's change
stated last, the model answers with that one (``bench/tiny_long_copy.py``'s decoy reading);
before RL the model writes the word ``answer:`` garbled, which RL fixes within 20 steps. The
long lengths are where it still falls short, before and after RL.

:func:`domains` are the tasks the shipped ``long`` config trains and evaluates, with the
corpus's options, and :func:`extrapolation` the one it only evaluates (a test keeps them in
step). Not done here: natural text, span answers, citations.
"""

from __future__ import annotations

from tempering.config import PretrainConfig, TaskSpec

LENGTHS = [256, 512, 1024, 2048, 4096]
"""The curriculum's lengths, in characters (the tokenizer's tokens)."""
LONGEST = LENGTHS[-1]
DOCS = [12000, 1200, 240, 60, 24]
"""Pre-training documents at each length, all kinds together: the short ones teach the
lookup, the long ones teach the attention to find one sentence in many."""
BATCH_TOKENS = 1100
"""Tokens in one optimizer step (padded): four documents at 256, two at 512, one from 1,024 on.
Small steps: the copying this model has to learn forms after a number of steps more than of
tokens (with 15 documents a step it had not formed in 200 steps)."""
ANSWER_ROOM = 16
"""Tokens of a document past its prompt's length: the answer line, begin and end."""
WRONG_SHARE = 0.0
"""Share of documents answered with the mistake (the stale value): none, since with half of
them so the lookup did not form."""
COPY_ROWS = 4
"""Copy rows a step (``pretrain.copy_rows``): the practice at copying that makes the lookup form."""
CONTEXT_WEIGHT = 0.05
"""Loss weight of a row's tokens before its answer (``pretrain.context_weight``), against 1 for
the answer's value and end and a copy row's repeat: the filler is most of a document's tokens."""

CORPUS: dict[str, tuple[float, dict]] = {
    "retrieval": (1.0, {"kind": "retrieval", "updates": 1}),
}
"""The corpus's kinds: a weight (its share of the documents) and the task's options."""


TRAINED = ("retrieval",)
"""The kinds the shipped ``long`` config trains: retrieval of a code changed later in the
document, whose classic mistake (the stale value) RL can fix."""


def _spec(kind: str) -> TaskSpec:
    """One corpus kind as a task: a curriculum over :data:`LENGTHS`, one token a character."""
    return TaskSpec(name=f"long_context:{kind}", options={**CORPUS[kind][1], "lengths": LENGTHS, "chars_per_token": 1.0})


def domains() -> list[TaskSpec]:
    """The tasks as RL trains them (:data:`TRAINED`)."""
    return [_spec(kind) for kind in TRAINED]


def extrapolation() -> TaskSpec:
    """The evaluation-only task (weight 0) at twice :data:`LONGEST`: retrieval past every
    trained length, read by the model's rotary positions without new weights."""
    kind, (_, options) = next(iter(CORPUS.items()))
    return TaskSpec(name=f"long_context:{kind}-{2 * LONGEST}", weight=0.0,
                    options={**options, "length_tokens": 2 * LONGEST, "chars_per_token": 1.0})


def corpus_tasks() -> list[TaskSpec]:
    """Every kind of :data:`CORPUS` with its weight and its share of :data:`DOCS` at each length."""
    total = sum(weight for weight, _ in CORPUS.values())
    return [_spec(kind).model_copy(update={"weight": weight, "options": {
                **_spec(kind).options, "corpus_docs": [max(1, round(n * weight / total)) for n in DOCS]}})
            for kind, (weight, _) in CORPUS.items()]


def stage_steps() -> list[int]:
    """Optimizer steps at each length: its documents over the documents a step holds there."""
    return [-(-n // max(1, BATCH_TOKENS // (length + ANSWER_ROOM))) for n, length in zip(DOCS, LENGTHS)]


def steps() -> int:
    """Optimizer steps that take the whole curriculum once."""
    return sum(stage_steps())


def recipe() -> PretrainConfig:
    """The pre-training of builtin:tiny-long (its cache entry is keyed by this). In float32,
    as the generalist's: a bf16 model would be another model on each kind of CPU."""
    return PretrainConfig(tasks=corpus_tasks(), wrong_share=WRONG_SHARE, hidden_size=128, layers=2, heads=4,
                          max_positions=2 * LONGEST + 128, steps=steps(), batch_docs=1, batch_tokens=BATCH_TOKENS,
                          lr=3e-3, warmup_steps=30, schedule="cosine", hold_steps=stage_steps()[0], copy_rows=COPY_ROWS,
                          context_weight=CONTEXT_WEIGHT, bf16=False, seed=0)
