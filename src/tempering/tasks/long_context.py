"""Long-context tasks over generated documents: find a fact, follow a chain, or add up a quantity.

``name: long_context`` with ``options: {kind: retrieval | multihop | consistency,
length_tokens: 4096}``. A document is filler sentences of random words with the statements the
question needs placed at random depths (:mod:`tempering.tasks.long_context_facts` draws them):

- ``retrieval``: one value, ``The code of {name} is {value}.``; the question asks for it;
- ``multihop``: a chain of ``hops`` links, ``{b} keeps the key of {a}.``, and the last holder's
  value; the question asks for the value of whoever holds the key of the first name, so the
  answer needs every link, in whatever ``order`` the document states them;
- ``consistency``: ``parts`` deliveries to one name, some recounted later; the answer is the
  total at the latest counts, so it must agree with several places of the document at once.

Harder options: ``updates`` (a value changed later in the document: the latest statement
holds, the earlier ones stay as stale values), ``near_misses`` (decoys that nearly match: the
same name with another field, a name one character away), ``order`` (a multihop chain stated
``chain``-wise, ``reversed`` or at ``random``), ``value: span`` (the answer is three words,
graded by ``match`` after normalisation, instead of a four-digit number graded by
``exact_match``).

Grading: ``grading: lenient`` (numbers only, no cites) takes the answer as a reader would: the
``answer:`` line when there is one, else the completion's last number, so a chat model that
states the code in a sentence is graded on the code it states, not on the format asked for.

Citations: ``cite: quote`` asks the answer to give each statement it used on a ``cite:`` line,
quoted exactly; ``cite: line`` numbers the document's sentences one per line and asks for the
numbers. Every problem carries what the ``consistency`` reward checks them against:
``meta["sentences"]`` (the document, sentence by sentence), ``meta["evidence"]`` and
``meta["decoys"]`` (indices into it of the statements the answer rests on, and of the near
misses and stale values).

Names, values and placements are random, so nothing can be answered from memory. Length is set
in tokens: with ``tokenizer`` (a path or hub id) documents are measured with it and trimmed to
fit; without one, ``chars_per_token`` (4 suits most BPE tokenizers; 1 the built-in
character-level model) converts the target to characters. A prompt is at most
``length_tokens`` long and falls short by less than one filler sentence (5-11 words).
``lengths`` (ascending) makes the task a curriculum over lengths: level ``i`` draws at
``lengths[i]``, and the scheduler raises the level as success passes ``promote_at``. Such a
task also lists them as ``eval_lengths``, and ``eval_problems_at(n, length)`` draws held-out
problems at any one of them whatever the level, so evaluation can read accuracy against length.
``read_at`` adds lengths that evaluation reads and training never draws (how far what was
trained carries: twice the longest trained length, say), to a curriculum's or to one length.

Pre-training documents (:meth:`LongContextTask.corpus_document`): the prompt and its answer
line, with a share of them answered by the classic mistake, a decoy's value; ``corpus_docs``
(one count per entry of ``lengths``) makes such a corpus a length curriculum.

The held-out split is a fixed hash partition of (kind, asked name, answer): one problem in
``EVAL_EVERY`` is evaluation-only, so training and evaluation never share a question.

Not done here: natural-language documents, statements that contradict each other without
saying which is later.
"""

from __future__ import annotations

import random
import re
import zlib
from typing import Any, Optional

from tempering.tasks.base import StreamState, check_grading
from tempering.tasks.long_context_facts import KINDS, MAX_DELIVERY_COUNTS, ORDERS, VALUES, Facts, Spec, interleave
from tempering.types import Problem, domain_of

EVAL_EVERY = 8
MIN_LENGTH = 32
WORDS = ["the", "river", "stone", "light", "garden", "paper", "window", "silver", "morning", "quiet", "market", "letter", "bridge", "orange", "winter", "cloud", "engine", "forest", "violet", "harbor", "candle", "meadow", "signal"]
ANSWER_ASK = "End with a line 'answer: X'."
CITES = {"none": ANSWER_ASK,
         "quote": "Cite each statement used as cite: \"<statement>\". " + ANSWER_ASK,
         "line": "Cite each line used as cite: N. " + ANSWER_ASK}
"""What the prompt asks for, by ``cite``: the answer line alone, or citation lines before it.
Short: every character of it stands between the document and the answer, and the built-in
long model finds a value only a few hundred characters back (fine-tuned to quote its cites,
it answered 58% of held-out problems at 384 characters with this ask, and none at 448 with
the earlier one of 155 characters)."""
LATEST_HOLDS = "When a value is changed or recounted later in the document, the latest statement holds."
METRICS = {"number": "exact_match", "span": "match"}
"""The reward that grades each kind of value: a number exactly, a span after normalisation. A
task that asks for cites is graded by ``cited_match`` instead (the answer after normalisation,
and the share whose cites are exactly the evidence beside it)."""


def _filler(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(5, 11))]
    return " ".join(words).capitalize() + "."


def _check_lengths(length_tokens: Optional[int], lengths: Optional[list[int]]) -> list[int]:
    """The lengths the task draws at (one, or a curriculum's ascending list), checked."""
    if length_tokens is not None and lengths is not None:
        raise ValueError("give length_tokens (one length) or lengths (a curriculum of them), not both")
    chosen = lengths if lengths is not None else [1024 if length_tokens is None else length_tokens]
    name = "lengths" if lengths is not None else "length_tokens"
    if not chosen or any(n < MIN_LENGTH for n in chosen):
        raise ValueError(f"{name} must be at least {MIN_LENGTH} tokens each, got {chosen}")
    if any(a >= b for a, b in zip(chosen, chosen[1:])):
        raise ValueError(f"lengths must rise from one level to the next, got {chosen}")
    return list(chosen)


def _check_read_at(read_at: Optional[list[int]], lengths: list[int]) -> list[int]:
    """Evaluation-only lengths, checked: each at least MIN_LENGTH, none twice or also drawn."""
    chosen = list(read_at or [])
    if any(n < MIN_LENGTH for n in chosen) or len(set(chosen)) < len(chosen) or set(chosen) & set(lengths):
        raise ValueError(f"read_at lists lengths evaluation reads that training does not draw: each at least "
                         f"{MIN_LENGTH} tokens, none twice and none of the trained {lengths}, got {chosen}")
    return sorted(chosen)


def _check_spec(kind: str, spec: Spec, cite: str, style: str, grading: str = "strict") -> None:
    check_grading(grading)
    checks = [
        (kind in KINDS, f"kind must be one of {', '.join(repr(k) for k in KINDS)}, got {kind!r}"),
        (spec.hops >= 1, f"hops (links in a multihop chain) must be at least 1, got {spec.hops}"),
        (spec.near_misses >= 0 and spec.updates >= 0,
         f"near_misses and updates must be 0 or more, got {spec.near_misses} and {spec.updates}"),
        (spec.order in ORDERS, f"order must be one of {', '.join(map(repr, ORDERS))}, got {spec.order!r}"),
        (spec.order == "random" or kind == "multihop",
         f"order {spec.order!r} orders a chain: it needs kind 'multihop'"),
        (spec.value in VALUES, f"value must be 'number' or 'span', got {spec.value!r}"),
        (spec.value == "number" or kind != "consistency", "kind 'consistency' answers a total: value must be 'number'"),
        (1 <= spec.parts and spec.parts + spec.updates + spec.near_misses <= 60,
         f"parts must be at least 1, and parts + updates + near_misses at most 60, got {spec.parts}, "
         f"{spec.updates} and {spec.near_misses}"),
        (kind != "consistency" or spec.parts + spec.updates <= MAX_DELIVERY_COUNTS,
         f"kind 'consistency': parts + updates must be at most {MAX_DELIVERY_COUNTS} (beyond, stale counts "
         f"often add up to the latest total), got {spec.parts} + {spec.updates}"),
        (cite in CITES, f"cite must be one of {', '.join(map(repr, CITES))}, got {cite!r}"),
        (style in ("raw", "chat"), f"style must be 'raw' or 'chat', got {style!r}"),
        (grading == "strict" or (spec.value == "number" and cite == "none"),
         "grading 'lenient' reads a number as a reader would: it needs value 'number' and cite 'none', "
         f"got value {spec.value!r} and cite {cite!r}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def _check_corpus_docs(corpus_docs: Optional[list[int]], lengths: list[int]) -> Optional[list[int]]:
    if corpus_docs is not None and (len(corpus_docs) != len(lengths) or any(n < 1 for n in corpus_docs)):
        raise ValueError(f"corpus_docs gives the pre-training documents at each of lengths {lengths}: one count "
                         f"of at least 1 per length, got {corpus_docs}")
    return corpus_docs


STATED_VALUE = re.compile(r" (?:is|was changed to) (.+)\.$")
"""A value statement's value (retrieval and multihop), as its decoys state one."""


class LongContextTask(StreamState):
    """Problems of one ``kind`` over documents of ``length_tokens`` (or the current level of
    ``lengths``); the options are the module docstring's, checked when the task is built."""

    def __init__(self, name: str, seed: int, kind: str = "retrieval", length_tokens: Optional[int] = None,
                 lengths: Optional[list[int]] = None, hops: int = 2, near_misses: int = 0, updates: int = 0,
                 order: str = "random", value: str = "number", parts: int = 3, cite: str = "none",
                 tokenizer: Optional[str] = None, chars_per_token: float = 4.0, style: str = "raw",
                 corpus_docs: Optional[list[int]] = None, domain: str = "", grading: str = "strict",
                 rewards: Optional[dict[str, float]] = None, read_at: Optional[list[int]] = None):
        self.spec = Spec(hops=hops, near_misses=near_misses, updates=updates, order=order, value=value, parts=parts)
        _check_spec(kind, self.spec, cite, style, grading)
        self.grading = grading
        if chars_per_token <= 0:
            raise ValueError(f"chars_per_token must be above 0, got {chars_per_token}")
        self.lengths = _check_lengths(length_tokens, lengths)
        self.read_at = _check_read_at(read_at, self.lengths)
        self.name, self.seed, self.kind, self.style, self.cite = name, seed, kind, style, cite
        self.hops, self.chars_per_token = hops, chars_per_token
        self.levels = len(self.lengths) if lengths is not None else 0
        """Curriculum levels for the scheduler (0 = no curriculum): one per entry of ``lengths``."""
        self.level = 0
        self.domain = domain_of(name, domain)
        self.metric = METRICS[value] if cite == "none" else "cited_match"
        self.rewards = dict(rewards or {self.metric: 1.0})
        self._tokenizer = None
        if tokenizer:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self._check_fits()
        self.corpus_docs = _check_corpus_docs(corpus_docs, self.lengths)

    @property
    def level(self) -> int:
        return self._level

    @level.setter
    def level(self, value: int) -> None:
        """The scheduler's curriculum step: the level's length is the length drawn from now on."""
        if not 0 <= value < len(self.lengths):
            raise ValueError(f"{self.name}: level {value} is not one of the {len(self.lengths)} lengths {self.lengths}")
        self._level = value
        self.length_tokens = self.lengths[value]

    def _tokens(self, text: str) -> float:
        if self._tokenizer is None:
            return len(text) / self.chars_per_token
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def _check_fits(self) -> None:
        """Refuse, when built, a shortest length that the statements alone would fill."""
        facts = KINDS[self.kind](random.Random(0), self.spec)
        needed = self._tokens(self._framing(facts.question) + " ".join(s for q in facts.sequences for s in q))
        if needed > self.lengths[0]:
            raise ValueError(f"length_tokens={self.lengths[0]} is too short: the question and its statements alone "
                             f"take about {needed} tokens; raise it, or lower hops, parts, near_misses or updates")

    def _framing(self, question: str) -> str:
        """What a prompt holds besides the document."""
        note = f"{LATEST_HOLDS}\n" if self.spec.updates else ""
        asks = CITES[self.cite] if self.cite != "none" or self.style == "chat" else ""
        return f"\n{note}Question: {question}\n{asks}"

    def evidence_depth(self, problem: Problem) -> Optional[float]:
        """How deep in ``problem``'s document its first evidence sentence starts: 0 at the
        document's first character, near 1 at its last sentence, next to the question (a
        needle-in-a-haystack depth); None for a problem without evidence.

        >>> task = LongContextTask("long_context", 0, length_tokens=1024, chars_per_token=1.0)
        >>> problem = task.eval_problems(1)[0]
        >>> depth = task.evidence_depth(problem)
        >>> 0 <= depth < 1, problem.prompt[round(depth * len(task._render(problem.meta["sentences"]))):].startswith("The ")
        (True, True)
        """
        sentences, evidence = problem.meta.get("sentences"), problem.meta.get("evidence")
        if not sentences or not evidence:
            return None
        first = min(evidence)
        before = len(self._render(sentences[:first])) + (1 if first else 0)  # and the break after it
        return before / len(self._render(sentences))

    def _render(self, sentences: list[str]) -> str:
        if self.cite == "line":
            return "\n".join(f"[{i}] {s}" for i, s in enumerate(sentences, 1))
        return " ".join(sentences)

    def _cost(self, sentence: str, number: int) -> float:
        """A sentence's tokens in the document, with its line number and the space or line break after it."""
        return self._tokens((f"[{number}] " if self.cite == "line" else "") + sentence + " ")

    def _document(self, rng: random.Random, statements: list[str], framing: str, length: int) -> list[str]:
        """The document's sentences: filler up to ``length`` tokens, ``statements`` at random
        depths in the order given."""
        budget = length - self._tokens(framing + "answer: 0000")
        budget -= sum(self._cost(s, len(statements)) for s in statements)
        sentences: list[str] = []
        used = 0.0
        while used < budget:
            sentences.append(_filler(rng))
            used += self._cost(sentences[-1], len(sentences))
        # the sum overshoots by up to a sentence, and word-piece counts are not additive: trim to the measured length
        limit = length - (8 if self._tokenizer is not None else 0)
        while sentences and self._tokens(self._render(sentences + statements) + framing) > limit:
            sentences.pop()
        slots = set(rng.sample(range(len(sentences) + len(statements)), len(statements)))
        filler, placed = iter(sentences), iter(statements)
        return [next(placed) if i in slots else next(filler) for i in range(len(sentences) + len(statements))]

    def _is_eval(self, first: str, answer: str) -> bool:
        return zlib.crc32(f"{self.kind}:{first}:{answer}".encode()) % EVAL_EVERY == 0

    def _draw(self, rng: random.Random, want_eval: bool, length: int) -> Problem:
        while True:
            facts: Facts = KINDS[self.kind](rng, self.spec)
            if self._is_eval(facts.first, facts.answer) == want_eval:
                break
        framing = self._framing(facts.question)
        statements = interleave(rng, facts.sequences)
        sentences = self._document(rng, statements, framing, length)
        text = self._render(sentences) + framing
        prompt: Any = text if self.style == "raw" else [{"role": "user", "content": text}]
        meta = {"facts": statements, "sentences": sentences, "cite": self.cite, "length_tokens": length,
                "grading": self.grading,
                "evidence": [i for i, s in enumerate(sentences) if s in facts.evidence],
                "decoys": [i for i, s in enumerate(sentences) if s in facts.decoys]}
        return Problem(task=self.name, id=f"{facts.first}:{facts.answer}", prompt=prompt, answer=facts.answer,
                       domain=self.domain, meta=meta)

    def train_problem(self, index: int) -> Problem:
        self._served(index)
        return self._draw(random.Random(f"{self.seed}:{self.name}:{index}"), want_eval=False,
                          length=self.length_tokens)

    def eval_problems(self, n: int) -> list[Problem]:
        """``n`` held-out problems at the current length (a curriculum's level sets it)."""
        return self.eval_problems_at(n, self.length_tokens)

    @property
    def eval_lengths(self) -> list[int]:
        """The lengths evaluation reads accuracy at, one by one: a curriculum's ``lengths`` and
        ``read_at``; none for a task of one length without ``read_at`` (its ``eval_problems``
        are already at it)."""
        return sorted(self.lengths + self.read_at) if self.levels or self.read_at else []

    def eval_problems_at(self, n: int, length: int) -> list[Problem]:
        """``n`` held-out problems at ``length`` tokens, the same at any level: seeded by the
        task and the length alone, and the task's level left as it is (a sampler may be drawing
        training problems meanwhile)."""
        rng = random.Random(f"eval:{self.name}:{self.kind}:{length}")
        return [self._draw(rng, want_eval=True, length=length) for _ in range(n)]

    def corpus_length(self, index: int) -> int:
        """The length of pre-training document ``index``: with ``corpus_docs``, the first
        ``corpus_docs[0]`` documents at ``lengths[0]``, the next ``corpus_docs[1]`` at
        ``lengths[1]`` and so on (a length curriculum in pre-training), the last length past
        their sum; without it, the current level's length."""
        for length, count in zip(self.lengths, self.corpus_docs or []):
            if index < count:
                return length
            index -= count
        return self.lengths[-1] if self.corpus_docs else self.length_tokens

    def corpus_document(self, index: int, wrong_share: float, tool_share: float = 0.0) -> str:
        """A pre-training document: training problem ``index`` at :meth:`corpus_length` and its
        answer line, with probability ``wrong_share`` the classic mistake instead: the value of
        a decoy (a stale value or a near miss's), where the problem has one that states a value
        (``consistency`` totals have none, and are always written right). The mistake is drawn
        per document, so the model learns both readings and RL has a choice to sharpen.
        ``tool_share`` is ignored: the task has no tool to call."""
        problem = self._draw(random.Random(f"{self.seed}:{self.name}:{index}"), want_eval=False,
                             length=self.corpus_length(index))
        rng = random.Random(f"corpus:{self.seed}:{self.name}:{index}")
        stated = [STATED_VALUE.search(problem.meta["sentences"][i]) for i in problem.meta["decoys"]]
        wrong = sorted(m.group(1) for m in stated if m and m.group(1) != problem.answer)
        answer = rng.choice(wrong) if wrong and rng.random() < wrong_share else problem.answer
        text = problem.prompt if isinstance(problem.prompt, str) else problem.prompt[-1]["content"]
        return f"{text}answer: {answer}"

    def _extra_state(self) -> dict[str, Any]:
        return {"level": self.level, "lengths": self.lengths}

    def _load_extra(self, state: dict[str, Any]) -> None:
        if state.get("lengths", self.lengths) != self.lengths:
            raise ValueError(f"{self.name}: the saved stream drew at lengths {state['lengths']}, this task at "
                             f"{self.lengths}; resume with the run's own lengths")
        self.level = int(state.get("level", 0))
