"""``builtin:tiny-long``: the small model that long-context RL starts from.

The built-in tiny model reads 256 positions and knows arithmetic; the generalist reads 320.
builtin:tiny-long is the same character-level Llama, narrower (128 wide, 2 layers, so that a
4,096-character document costs seconds, not tens of seconds, forward and backward on one
core), with room for 8,320 positions, pre-trained offline on ``long_context`` documents
(:data:`CORPUS`): retrieval of a code whose value was changed later in the document.

The corpus is a length curriculum (the task's ``corpus_docs``) over :data:`PRETRAINED`: most
documents at the shortest length, where the lookup is learned cheaply, then fewer and fewer at
each doubling up to 2,048, with steps of an even token count (``batch_tokens``), so each long
document is a step of its own. 4,096, the longest length of RL's curriculum (:data:`LENGTHS`),
is left to RL. What makes the lookup form at all (``bench/tiny_long_copy.py``, and
docs/models.md for the measures): on documents alone, four answer digits in a few hundred
characters, the answer stayed at chance in every try; :data:`COPY_ROWS` rows a step that repeat
a random string (``pretrain.copy_rows``), a loss that leans on the answer
(:data:`CONTEXT_WEIGHT`), a learning rate held at its peak (the copy forms after a plateau of
about 1,500 steps) and every answer right, retrieval alone, make it form, with rotary positions
in both layers, by about step 2,000.

What makes it reach: at :data:`DROP_AT` the last layer, where the lookup is, drops its rotary
positions (``pretrain.nope_layers``; the model is then transformers' SmolLM3, a Llama that lists
its layers without positions) and reads by content alone. With
positions in both layers the lookup reached about 250 characters back, whatever the length
trained (22% of values at 1,024, 0% at 4,096); without them in the last layer, trained from
scratch, it never formed; dropped after it formed, it relearns within a few hundred steps and
carries to lengths past the trained ones (docs/models.md has the measures). It is a lookup of
the latest change (``changed to``), not of the asked name: every corpus document has one name.

:func:`domains` are the tasks the shipped ``long`` config trains and evaluates, with the
corpus's options, and :func:`extrapolation` the one it only evaluates (a test keeps them in
step). Not done here: natural text, span answers, citations.
"""

from __future__ import annotations

from tempering.config import PretrainConfig, TaskSpec

LENGTHS = [256, 512, 1024, 2048, 4096]
"""RL's length curriculum, in characters (the tokenizer's tokens)."""
LONGEST = LENGTHS[-1]
PRETRAINED = LENGTHS[:-1]
"""Pre-training's lengths: all but the longest, which RL is left to learn."""
DOCS = [14000, 1200, 480, 240]
"""Pre-training documents at each length, all kinds together: the short ones teach the
lookup, the long ones teach the attention to find one sentence in many. Sensitive: with 240
and 60 from 1,024 on, or 240 and 240, the same recipe came out far weaker at every length
(docs/models.md, one run each)."""
BATCH_TOKENS = 1100
"""Tokens in one optimizer step (padded): four documents at 256, two at 512, one from 1,024 on.
Small steps: the copying this model has to learn forms after a number of steps more than of
tokens (with 15 documents a step it had not formed in 200 steps)."""
ANSWER_ROOM = 16
"""Tokens of a document past its prompt's length: the answer line, begin and end."""
WRONG_SHARE = 0.0
"""Share of documents answered with the mistake (the stale value): none, since with half of
them so the lookup did not form."""
DROP_AT = 3000
"""The optimizer step at which the last layer drops its rotary positions (``pretrain.nope_layers``,
``nope_from_step``), 500 steps before the shortest documents end: the lookup forms with positions
(by about step 2,000), and reads by content alone after."""
NOPE_LAYERS = [1]
"""The layers that read without positions after :data:`DROP_AT`: the last, where the lookup is."""
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


def _spec(kind: str, lengths: list[int] = LENGTHS) -> TaskSpec:
    """One corpus kind as a task: a curriculum over ``lengths``, one token a character."""
    return TaskSpec(name=f"long_context:{kind}", options={**CORPUS[kind][1], "lengths": lengths, "chars_per_token": 1.0})


def domains() -> list[TaskSpec]:
    """The tasks as RL trains them (:data:`TRAINED`)."""
    return [_spec(kind) for kind in TRAINED]


def extrapolation() -> TaskSpec:
    """The evaluation-only task (weight 0) at twice :data:`LONGEST`: retrieval past every
    length pre-training or RL trained."""
    kind, (_, options) = next(iter(CORPUS.items()))
    return TaskSpec(name=f"long_context:{kind}-{2 * LONGEST}", weight=0.0,
                    options={**options, "length_tokens": 2 * LONGEST, "chars_per_token": 1.0})


def corpus_tasks() -> list[TaskSpec]:
    """Every kind of :data:`CORPUS` with its weight and its share of :data:`DOCS` at each length of :data:`PRETRAINED`."""
    total = sum(weight for weight, _ in CORPUS.values())
    return [_spec(kind, PRETRAINED).model_copy(update={"weight": weight, "options": {
                **_spec(kind, PRETRAINED).options, "corpus_docs": [max(1, round(n * weight / total)) for n in DOCS]}})
            for kind, (weight, _) in CORPUS.items()]


def stage_steps() -> list[int]:
    """Optimizer steps at each length: its documents over the documents a step holds there."""
    return [-(-n // max(1, BATCH_TOKENS // (length + ANSWER_ROOM))) for n, length in zip(DOCS, PRETRAINED)]


def steps() -> int:
    """Optimizer steps that take the whole curriculum once."""
    return sum(stage_steps())


def recipe() -> PretrainConfig:
    """The pre-training of builtin:tiny-long (its cache entry is keyed by this). In float32,
    as the generalist's: a bf16 model would be another model on each kind of CPU."""
    return PretrainConfig(tasks=corpus_tasks(), wrong_share=WRONG_SHARE, hidden_size=128, layers=2, heads=4,
                          max_positions=2 * LONGEST + 128, steps=steps(), batch_docs=1, batch_tokens=BATCH_TOKENS,
                          lr=3e-3, warmup_steps=30, schedule="cosine", hold_steps=DROP_AT, copy_rows=COPY_ROWS,
                          context_weight=CONTEXT_WEIGHT, nope_layers=NOPE_LAYERS,
                          nope_from_step=DROP_AT, bf16=False, seed=0)
