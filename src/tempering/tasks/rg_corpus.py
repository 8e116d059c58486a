"""Pre-training documents for reasoning-gym types: worked solutions and their classic mistakes.

A small model trained from scratch learns a reasoning-gym type when the document shows the
work a person would write (the running total of a chain sum, Euclid's remainders, the
multiples of the larger number, the halvings of a number, the primes in a range), and RL
has something to fix when a share of the documents carries the type's classic mistake: a
minus read as a plus, Euclid stopped after one remainder, the product taken for the least
common multiple, the lowest bit left out, a range read as exclusive, a word's letters counted
once per word, a doubled letter written once. Each mistake shows only on some problems (where
the chain has a minus, where the numbers share a factor, where the number is odd...), as the
arithmetic tasks' missing carry does, so a model that writes it on every problem is still
right on the rest.

:data:`WORKED` maps a type to ``solve(entry, buggy) -> (lines, answer)``; a type not in it is
written as its answer alone, with no mistake. Every solution is checked against
reasoning-gym's own answer, so a worked solution that disagrees with the generator (a changed
reasoning-gym) fails loudly instead of teaching a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Solution = tuple[list[str], str]


def _chain_sum(entry: dict[str, Any], buggy: bool) -> Solution:
    """``57+87=144`` per term; the mistake reads every minus as a plus."""
    tokens = entry["metadata"]["expression"].split()
    total, lines = int(tokens[0]), []
    for op, number in zip(tokens[1::2], tokens[2::2]):
        plus = op == "+" or buggy
        value = total + int(number) if plus else total - int(number)
        lines.append(f"{total}{'+' if plus else '-'}{number}={value}")
        total = value
    return lines, str(total)


def _gcd(entry: dict[str, Any], buggy: bool) -> Solution:
    """Euclid's remainders, ``69%21=6``; the mistake stops after the first one and answers the
    smaller number (right only when it divides the larger)."""
    a, b = sorted(entry["metadata"]["numbers"], reverse=True)
    lines = []
    while b:
        lines.append(f"{a}%{b}={a % b}")
        if buggy:
            return lines, str(b)
        a, b = b, a % b
    return lines, str(a)


def _lcm(entry: dict[str, Any], buggy: bool) -> Solution:
    """The multiples of the larger number up to the first the smaller divides; the mistake
    takes the product (right only when the numbers share no factor)."""
    small, large = sorted(entry["metadata"]["numbers"])
    if buggy:
        return [f"{large}*{small}={large * small}"], str(large * small)
    multiples = [large]
    while multiples[-1] % small:
        multiples.append(multiples[-1] + large)
    return [" ".join(map(str, multiples))], str(multiples[-1])


def _count_bits(entry: dict[str, Any], buggy: bool) -> Solution:
    """The number halved down to 1, each with its last bit (``13:1 6:0 3:1 1:1``); the mistake
    counts from the second halving, leaving out the lowest bit (right on even numbers)."""
    n, steps = int(entry["metadata"]["number"]), []
    while n:
        steps.append(f"{n}:{n % 2}")
        n //= 2
    counted = steps[1:] if buggy else steps
    return [" ".join(steps)], str(sum(int(step.split(":")[1]) for step in counted))


def _letter_counting(entry: dict[str, Any], buggy: bool) -> Solution:
    """Each word holding the letter with its count in it; the mistake counts such a word once
    (right unless a word holds the letter twice)."""
    letter = entry["metadata"]["target_letter"].lower()
    found = [(word, word.lower().count(letter)) for word in entry["metadata"]["span"] if letter in word.lower()]
    if buggy:
        found = [(word, 1) for word, _ in found]
    return [" ".join(f"{word}:{count}" for word, count in found) or "none"], str(sum(c for _, c in found))


def _primes(low: int, high: int) -> list[int]:
    return [n for n in range(max(low, 2), high + 1) if all(n % d for d in range(2, int(n ** 0.5) + 1))]


def _count_primes(entry: dict[str, Any], buggy: bool) -> Solution:
    """The primes in the range, listed; the mistake reads the range as exclusive (right unless
    an end is prime)."""
    start, end = int(entry["metadata"]["start"]), int(entry["metadata"]["end"])
    found = _primes(start + 1, end - 1) if buggy else _primes(start, end)
    return [" ".join(map(str, found)) or "none"], str(len(found))


def _spell_backward(entry: dict[str, Any], buggy: bool) -> Solution:
    """The word backward; the mistake writes a doubled letter once (right unless the word has
    one, as ``letter`` or ``moon``)."""
    backward = entry["metadata"]["word"][::-1]
    if buggy:
        backward = "".join(c for i, c in enumerate(backward) if i == 0 or c != backward[i - 1])
    return [], backward


def _number_sequence(entry: dict[str, Any], buggy: bool) -> Solution:
    """The next term; the mistake continues the last difference (right on arithmetic rules)."""
    sequence = entry["metadata"]["sequence"]
    if buggy:
        return [], str(2 * sequence[-2] - sequence[-3])
    return [], str(sequence[-1])


WORKED: dict[str, Callable[[dict[str, Any], bool], Solution]] = {
    "chain_sum": _chain_sum, "gcd": _gcd, "lcm": _lcm, "count_bits": _count_bits,
    "letter_counting": _letter_counting, "count_primes": _count_primes,
    "spell_backward": _spell_backward, "number_sequence": _number_sequence,
}


def document_body(rg_type: str, entry: dict[str, Any], buggy: bool) -> str:
    """What follows the question in a pre-training document: the worked lines and
    ``answer: X``, with the type's classic mistake when ``buggy`` (where it shows)."""
    solve = WORKED.get(rg_type)
    if solve is None:
        return f"answer: {entry['answer']}"
    lines, answer = solve(entry, False)
    if answer != str(entry["answer"]):
        raise ValueError(f"reasoning-gym type {rg_type!r}: the worked solution gives {answer!r} where the "
                         f"generator's answer is {entry['answer']!r} (question {entry['question']!r})")
    if buggy:
        lines, answer = solve(entry, True)
    return "\n".join([*lines, f"answer: {answer}"])
