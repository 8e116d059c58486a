"""The facts a long-context question hides in its document, one plain function per kind.

A kind (:data:`KINDS`) draws, from a seeded generator and the task's :class:`Spec`, the
statements to place in the document, the question, the answer, and which statements the
answer rests on (``evidence``) and which only look as if it did (``decoys``):

- ``retrieval``: ``The code of {name} is {value}.``; the question asks for the value;
- ``multihop``: ``{b} keeps the key of {a}.`` links from the asked name to a last holder, and
  that holder's value; ``order`` places the links in the chain's order, against it, or at random;
- ``consistency``: deliveries to one name, ``{name} received a delivery of {n} boxes labelled
  {label}.``, some recounted later; the answer is the total at the latest counts, so it must
  agree with every delivery's latest statement at once.

Options common to the kinds: ``updates`` later statements that change a value (``... was
changed to ...``, ``... was recounted at ...``; the latest one in the document holds, the
earlier ones become decoys) and ``near_misses`` decoys that nearly match: the asked name with
another field (``The room of {name} ...``, ``{name} sent out ...``), a name one character
away with the asked field, and for ``multihop`` a link into a name one character away from a
chain name. Values are numbers (``value: number``) or spans of three words from a vocabulary
the filler never uses (``value: span``); a value never repeats one drawn before for the same
question, so no decoy states the answer.

Statements come in sequences whose order is fixed (a value, then its changes; a chain in
``order: chain``); :func:`interleave` mixes the sequences at random, and the task places the
result in document order among the filler.

Not done here: statements that contradict without saying which is later, arithmetic beyond a
sum, answers that need the document's layout.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field

SPAN_WORDS = ["amber", "falcon", "copper", "lantern", "velvet", "north", "echo", "maple", "crimson", "otter",
              "granite", "willow", "saffron", "tundra", "cobalt", "juniper", "ember", "lagoon", "thistle", "quartz"]
"""Words of span values; none is a filler word, so a span appears only where it is stated."""


@dataclass(frozen=True)
class Spec:
    """What a kind draws: the task's options that shape the facts."""

    hops: int = 2
    near_misses: int = 0
    updates: int = 0
    order: str = "random"
    value: str = "number"
    parts: int = 3


@dataclass
class Facts:
    """A question and the statements it hides, as sequences whose own order is kept."""

    sequences: list[list[str]]
    question: str
    first: str
    """The asked name: with the answer, what the held-out split hashes."""
    answer: str
    evidence: set[str] = field(default_factory=set)
    """The statements the answer rests on (each value's latest one, every link)."""
    decoys: set[str] = field(default_factory=set)
    """Near misses and values overwritten later."""


@dataclass(frozen=True)
class ValueType:
    field: str
    """The asked field (``code``, ``password``)."""
    others: tuple[str, ...]
    """Fields of the same name that near misses state."""
    draw: Callable[[random.Random], str]


def _number(rng: random.Random) -> str:
    return str(rng.randint(1000, 9999))


def _span(rng: random.Random) -> str:
    return " ".join(rng.sample(SPAN_WORDS, 3))


VALUES = {"number": ValueType("code", ("room", "badge"), _number),
          "span": ValueType("password", ("motto", "greeting"), _span)}


def name(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(2)) + "-" + str(rng.randint(100, 999))


def near_name(rng: random.Random, original: str) -> str:
    """``original`` with one digit changed: a name a careless reader takes for it.

    >>> sum(a != b for a, b in zip(near_name(random.Random(0), "AB-123"), "AB-123"))
    1
    """
    position = rng.randrange(len(original) - 3, len(original))
    leading = position == len(original) - 3  # the number's first digit is never 0
    digit = rng.choice([d for d in string.digits if d != original[position] and not (leading and d == "0")])
    return original[:position] + digit + original[position + 1:]


def fresh(rng: random.Random, draw: Callable[[random.Random], str], used: set[str]) -> str:
    """A value from ``draw`` not in ``used`` (which it joins), so no two statements share one."""
    while True:
        value = draw(rng)
        if value not in used:
            used.add(value)
            return value


def interleave(rng: random.Random, sequences: list[list[str]]) -> list[str]:
    """The sequences merged in a uniformly random order that keeps each one's own order.

    >>> merged = interleave(random.Random(1), [["a1", "a2", "a3"], ["b1", "b2"]])
    >>> sorted(merged), [x for x in merged if x[0] == "a"]
    (['a1', 'a2', 'a3', 'b1', 'b2'], ['a1', 'a2', 'a3'])
    """
    queues = [list(s) for s in sequences if s]
    merged = []
    while queues:
        queue = rng.choices(queues, weights=[len(q) for q in queues])[0]
        merged.append(queue.pop(0))
        queues = [q for q in queues if q]
    return merged


def _valued(rng: random.Random, spec: Spec, holder: str, used: set[str], facts: Facts) -> list[str]:
    """``holder``'s value and its ``updates`` changes, in time order; the answer is the last."""
    kind = VALUES[spec.value]
    values = [fresh(rng, kind.draw, used) for _ in range(spec.updates + 1)]
    statements = [f"The {kind.field} of {holder} is {values[0]}."]
    statements += [f"The {kind.field} of {holder} was changed to {v}." for v in values[1:]]
    facts.answer = values[-1]
    facts.evidence.add(statements[-1])
    facts.decoys.update(statements[:-1])
    return statements


def _near_value(rng: random.Random, spec: Spec, holder: str, used: set[str], i: int) -> str:
    """The ``i``-th value near miss: the holder's other field, or a near name's asked field."""
    kind = VALUES[spec.value]
    value = fresh(rng, kind.draw, used)
    if i % 2 == 0:
        return f"The {kind.others[(i // 2) % len(kind.others)]} of {holder} is {value}."
    return f"The {kind.field} of {near_name(rng, holder)} is {value}."


def retrieval(rng: random.Random, spec: Spec) -> Facts:
    holder, used = name(rng), set()
    facts = Facts([], f"What is the {VALUES[spec.value].field} of {holder}?", holder, "")
    facts.sequences.append(_valued(rng, spec, holder, used, facts))
    near = [_near_value(rng, spec, holder, used, i) for i in range(spec.near_misses)]
    facts.decoys.update(near)
    facts.sequences += [[s] for s in near]
    return facts


ORDERS: dict[str, Callable[[list[str], list[str]], list[list[str]]]] = {
    "random": lambda links, valued: [[link] for link in links] + [valued],
    "chain": lambda links, valued: [links + valued],
    "reversed": lambda links, valued: [valued + links[::-1]],
}
"""How a multihop chain's statements are ordered in the document, from its links (first hop
first) and the last holder's value statements (in time order, which every order keeps)."""


def multihop(rng: random.Random, spec: Spec) -> Facts:
    names, used = [name(rng) for _ in range(spec.hops + 1)], set()
    field_name = VALUES[spec.value].field
    facts = Facts([], f"What is the {field_name} of whoever keeps the key of {names[0]}?", names[0], "")
    links = [f"{b} keeps the key of {a}." for a, b in zip(names, names[1:])]
    facts.evidence.update(links)
    facts.sequences = ORDERS[spec.order](links, _valued(rng, spec, names[-1], used, facts))
    near = []
    for i in range(spec.near_misses):
        if i % 3 == 2:  # a lure: someone keeps the key of a name one character away from the chain's
            near.append(f"{name(rng)} keeps the key of {near_name(rng, names[rng.randrange(len(names) - 1)])}.")
        else:
            near.append(_near_value(rng, spec, names[-1], used, i - i // 3))
    facts.decoys.update(near)
    facts.sequences += [[s] for s in near]
    return facts


MAX_DELIVERY_COUNTS = 16
"""For ``consistency``: the most ``parts + updates``; beyond it a stale reading reaching the
latest total becomes the rule."""
TRIES = 200


def only_latest_totals(histories: list[list[int]]) -> bool:
    """Whether reading every part at its latest count is the only way to reach the latest total:
    no mix of stale and latest counts adds up to it.

    >>> only_latest_totals([[20, 35], [60, 50]]), only_latest_totals([[20, 35], [60, 45]])
    (True, False)
    """
    reachable = {(0, True)}  # (total so far, whether every part so far was read at its latest count)
    for history in histories:
        reachable = {(total + count, latest and count == history[-1])
                     for total, latest in reachable for count in history}
    answer = sum(history[-1] for history in histories)
    return (answer, False) not in reachable


def _deliveries(rng: random.Random, spec: Spec, labels: set[str]) -> list[tuple[str, list[int]]]:
    """``parts`` labels with their counts in time order (``updates`` recounts spread among
    them), drawn again until no stale reading gives the latest total. With ``parts + updates``
    at most :data:`MAX_DELIVERY_COUNTS` a draw passes with probability above 0.4 (measured),
    so :data:`TRIES` draws never all fail in practice."""
    for _ in range(TRIES):
        counts: set[str] = set()
        parts = [(fresh(rng, lambda r: f"#{r.randint(100, 999)}", labels), [int(fresh(rng, _count, counts))])
                 for _ in range(spec.parts)]
        for _ in range(spec.updates):
            parts[rng.randrange(len(parts))][1].append(int(fresh(rng, _count, counts)))
        if only_latest_totals([history for _, history in parts]):
            return parts
        labels.difference_update(label for label, _ in parts)
    raise ValueError(f"no deliveries in {TRIES} draws whose total only the latest counts reach; lower parts or updates")


def _count(rng: random.Random) -> str:
    return str(rng.randint(11, 99))


def consistency(rng: random.Random, spec: Spec) -> Facts:
    holder, labels = name(rng), set()
    parts = _deliveries(rng, spec, labels)
    sequences = []
    for label, (count, *recounts) in parts:
        sequences.append([f"{holder} received a delivery of {count} boxes labelled {label}."]
                         + [f"The delivery to {holder} labelled {label} was recounted at {n} boxes." for n in recounts])
    question = f"How many boxes has {holder} received in all, counting each delivery at its latest count?"
    facts = Facts(sequences, question, holder, str(sum(history[-1] for _, history in parts)))
    facts.evidence = {statements[-1] for statements in sequences}
    facts.decoys = {s for statements in sequences for s in statements[:-1]}
    counts = {str(n) for _, history in parts for n in history}
    for i in range(spec.near_misses):
        label, count = fresh(rng, lambda r: f"#{r.randint(100, 999)}", labels), fresh(rng, _count, counts)
        who, verb = (holder, "sent out") if i % 2 == 0 else (near_name(rng, holder), "received a delivery of")
        sequences.append([f"{who} {verb} {count} boxes labelled {label}."])
        facts.decoys.add(sequences[-1][0])
    return facts


KINDS: dict[str, Callable[[random.Random, Spec], Facts]] = {
    "retrieval": retrieval, "multihop": multihop, "consistency": consistency}
