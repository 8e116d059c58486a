"""Long-context tasks over generated documents: find one fact, or follow a chain of them.

``name: long_context`` with ``options: {kind: retrieval | multihop, length_tokens: 4096}``.
A document is filler sentences of random words with the facts the question needs placed at
random depths:

- ``retrieval``: one fact, ``The code of {name} is {number}.``; the question asks for the code;
- ``multihop``: a chain of ``hops`` facts, ``{a} keeps the key of {b}.`` ... and the last
  holder's code; the question asks for the code of whoever holds the key of the first name,
  so the answer needs every link, wherever each one sits in the document.

Names and codes are random, so nothing can be answered from memory, and the answer is one
number, graded by ``exact_match`` on the ``answer:`` line.

Length is set in tokens: with ``tokenizer`` (a path or hub id) documents are measured with it
and trimmed to fit; without one, ``chars_per_token`` (4 suits most BPE tokenizers; 1 the
built-in character-level model) converts the target to characters. A prompt is at most
``length_tokens`` long and falls short by less than one filler sentence (5-11 words). The
built-in tiny model handles 256 positions, so lengths beyond that are for real models.

The held-out split is a fixed hash partition of (kind, first name, code): one problem in
``EVAL_EVERY`` is evaluation-only, so training and evaluation never share a question.

Not done here: natural-language documents, distractor facts that nearly match, answers that
are spans of text rather than numbers.
"""

from __future__ import annotations

import random
import string
import zlib
from typing import Any

from tempering.tasks.base import StreamState
from tempering.types import Problem, domain_of

EVAL_EVERY = 8
WORDS = ["the", "river", "stone", "light", "garden", "paper", "window", "silver", "morning", "quiet", "market", "letter", "bridge", "orange", "winter", "cloud", "engine", "forest", "violet", "harbor", "candle", "meadow", "signal"]


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(2)) + "-" + str(rng.randint(100, 999))


def _filler(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(5, 11))]
    return " ".join(words).capitalize() + "."


class LongContextTask(StreamState):
    def __init__(self, name: str, seed: int, kind: str = "retrieval", length_tokens: int = 1024, hops: int = 2,
                 tokenizer: str | None = None, chars_per_token: float = 4.0, style: str = "raw",
                 domain: str = "", rewards: dict[str, float] | None = None):
        if kind not in ("retrieval", "multihop"):
            raise ValueError(f"kind must be 'retrieval' or 'multihop', got {kind!r}")
        if length_tokens < 32:
            raise ValueError(f"length_tokens must be at least 32, got {length_tokens}")
        if hops < 1:
            raise ValueError(f"hops (links in a multihop chain) must be at least 1, got {hops}")
        if style not in ("raw", "chat"):
            raise ValueError(f"style must be 'raw' or 'chat', got {style!r}")
        self.name, self.seed, self.kind, self.style = name, seed, kind, style
        self.length_tokens, self.hops, self.chars_per_token = length_tokens, hops, chars_per_token
        self.domain = domain_of(name, domain)
        self.rewards = dict(rewards or {"exact_match": 1.0})
        self.metric = "exact_match"
        self._tokenizer = None
        if tokenizer:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(tokenizer)

    def _tokens(self, text: str) -> int:
        if self._tokenizer is None:
            return int(len(text) / self.chars_per_token)
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def _facts(self, rng: random.Random) -> tuple[list[str], str, str, int]:
        """The facts to hide, the question, the first name (for the split) and the answer."""
        code = rng.randint(1000, 9999)
        if self.kind == "retrieval":
            first = _name(rng)
            return [f"The code of {first} is {code}."], f"What is the code of {first}?", first, code
        names = [_name(rng) for _ in range(self.hops + 1)]
        facts = [f"{a} keeps the key of {b}." for a, b in zip(names[1:], names)]
        facts.append(f"The code of {names[-1]} is {code}.")
        rng.shuffle(facts)
        return facts, f"What is the code of whoever keeps the key of {names[0]}?", names[0], code

    def _document(self, rng: random.Random, facts: list[str], question: str) -> str:
        budget = self.length_tokens - self._tokens(question + "\nQuestion: \nanswer: 0000") - sum(map(self._tokens, facts))
        sentences: list[str] = []
        used = 0
        while used < budget:
            sentences.append(_filler(rng))
            used += self._tokens(sentences[-1]) + 1  # + the joining space
        if self._tokenizer is not None:  # word-piece counts are not additive: trim to the measured length
            while sentences and self._tokens(" ".join(sentences + facts) + question) > self.length_tokens - 8:
                sentences.pop()
        for fact in facts:
            sentences.insert(rng.randint(0, len(sentences)), fact)
        return " ".join(sentences)

    def _is_eval(self, first: str, code: int) -> bool:
        return zlib.crc32(f"{self.kind}:{first}:{code}".encode()) % EVAL_EVERY == 0

    def _draw(self, rng: random.Random, want_eval: bool) -> Problem:
        while True:
            facts, question, first, code = self._facts(rng)
            if self._is_eval(first, code) == want_eval:
                break
        document = self._document(rng, facts, question)
        text = f"{document}\nQuestion: {question}\n"
        prompt: Any = text if self.style == "raw" else [{"role": "user", "content": text + "End with a line 'answer: N'."}]
        return Problem(task=self.name, id=f"{first}:{code}", prompt=prompt, answer=str(code), domain=self.domain,
                       meta={"facts": facts})

    def train_problem(self, index: int) -> Problem:
        self._served(index)
        return self._draw(random.Random(f"{self.seed}:{self.name}:{index}"), want_eval=False)

    def eval_problems(self, n: int) -> list[Problem]:
        rng = random.Random(f"eval:{self.name}:{self.kind}:{self.length_tokens}")
        return [self._draw(rng, want_eval=True) for _ in range(n)]
