"""A ``repo`` family about words: a tokenizer with stop words, counts and word pairs.

See :mod:`tempering.tasks.repo_families` for what a family and a defect are. As in
:mod:`tempering.tasks.repo_families_money`, every expected value is computed here, and the
modules' own tests stay clear of the edges the level-1 defects sit on (a word of exactly the
minimum length, words tied in count).
"""

from __future__ import annotations

import random

from tempering.tasks.repo_families import Defect, Params, RepoFamily, words

CONTENT_WORDS = ("river", "stone", "cloud", "maple", "amber", "cedar", "delta", "ember", "frost", "grove",
                 "harbor", "island", "jasper", "kettle", "lantern", "meadow")
STOP_WORDS = ("the", "and", "with", "from", "this", "that", "into", "over")
SHORT_WORDS = {2: ("ox", "go", "up", "we"), 3: ("cat", "sun", "owl", "fig")}
TINY_WORDS = {2: ("a", "i"), 3: ("to", "of", "a")}
PUNCTUATION = ".,;:!?\"()"


def _clean(text: str) -> str:
    for mark in PUNCTUATION:
        text = text.replace(mark, " ")
    return text.lower()


def _tokenizer(rng: random.Random) -> Params:
    minlen = rng.choice((2, 3))
    stops = sorted(rng.sample(STOP_WORDS, 3))
    w1, w2, w3, w4 = words(rng, 4, CONTENT_WORDS)
    short, tiny = rng.choice(SHORT_WORDS[minlen]), rng.choice(TINY_WORDS[minlen])
    text1 = f"{w1.title()} {stops[0]} {tiny} {w2}."
    text2 = f"{w1}, {w2}; {w1}!"
    text3 = f"{w3} {w1} {w2} {w1} {w3} {w1}"
    first, second = sorted((w2, w4))
    tie_text = f"{second} {first} {second.title()} {first}."
    stop_text = f"{stops[1].title()} {w1} {stops[1]} {w2}."
    pair_text = f"{w1} {w2} {stops[2]} {w1} {w2} {w3}"
    pairs = [(w1, w2), (w2, w1), (w1, w2), (w2, w3)]
    pair_counts = {pair: pairs.count(pair) for pair in pairs}
    return {"minlen": minlen, "stops": "{" + ", ".join(repr(s) for s in stops) + "}",
            "raw": f"{w1.title()}, {w2.upper()}!", "cleaned": repr(_clean(f"{w1.title()}, {w2.upper()}!")),
            "text1": text1, "words1": repr([w1, w2]), "text2": text2, "freq2": repr({w1: 2, w2: 1}),
            "text3": text3, "top3": repr([(w1, 3), (w3, 2)]), "short": short, "short_text": f"{w3} {short} {w4}",
            "short_words": repr([w3, short, w4]), "tie_text": tie_text, "tie_top": repr([(first, 2), (second, 2)]),
            "tie_bad": repr([(second, 2), (first, 2)]), "stop": stops[1], "stop_text": stop_text,
            "stop_freq": repr({stops[1]: 2, w1: 1, w2: 1}), "pair_text": pair_text,
            "pairs": repr(pairs), "top_pairs": repr(sorted(pair_counts.items(), key=lambda item: (-item[1], item[0]))[:2])}


TOKENIZER = RepoFamily(
    name="tokenizer",
    summary="Words of a text, and how often they occur.",
    packages=("textkit", "wordsplit", "tokens", "sift", "chopper", "lexicon"),
    draw=_tokenizer,
    modules={
        "normalize": '''"""Text cleaned before it is split into words."""

PUNCTUATION = ".,;:!?\\"()"


def clean(text):
    """text lower-cased, each punctuation mark replaced by a space."""
    for mark in PUNCTUATION:
        text = text.replace(mark, " ")
    return text.lower()
''',
        "words": '''"""Splitting text into words."""

from $pkg.normalize import clean

MIN_LENGTH = $minlen
STOPWORDS = $stops


def words(text):
    """The words of text with at least MIN_LENGTH letters, stop words left out."""
    return [w for w in clean(text).split() if len(w) >= MIN_LENGTH and w not in STOPWORDS]


def pairs(text):
    """Each two neighbouring words of words(text), in order."""
    found = words(text)
    return list(zip(found, found[1:]))
''',
        "counts": '''"""Word counts."""

from $pkg.normalize import clean
from $pkg.words import MIN_LENGTH, pairs


def frequencies(text):
    """How often each word of at least MIN_LENGTH letters occurs (stop words counted too)."""
    found = {}
    for w in clean(text).split():
        if len(w) >= MIN_LENGTH:
            found[w] = found.get(w, 0) + 1
    return found


def top(text, k):
    """The k most frequent (word, count) pairs, most frequent first, ties in alphabetical order."""
    return sorted(frequencies(text).items(), key=lambda item: (-item[1], item[0]))[:k]


def top_pairs(text, k):
    """The k most frequent neighbouring pairs of words with their counts, ordered as top orders words."""
    found = {}
    for pair in pairs(text):
        found[pair] = found.get(pair, 0) + 1
    return sorted(found.items(), key=lambda item: (-item[1], item[0]))[:k]
'''},
    tests={
        "normalize": '''from $pkg.normalize import clean


def test_clean():
    assert clean("$raw") == $cleaned
''',
        "words": '''from $pkg.words import words


def test_words_leave_out_short_and_stop_words():
    assert words("$text1") == $words1
''',
        "counts": '''from $pkg.counts import frequencies, top


def test_frequencies():
    assert frequencies("$text2") == $freq2


def test_top():
    assert top("$text3", 2) == $top3
'''},
    defects=(
        Defect("shortest_word", 1, "words",
               "Words of exactly MIN_LENGTH ($minlen) letters are dropped: `words('$short_text')` leaves out "
               "'$short', though it is long enough.",
               bug=(("words", "if len(w) >= MIN_LENGTH and w not in STOPWORDS]",
                     "if len(w) > MIN_LENGTH and w not in STOPWORDS]"),),
               tests='''from $pkg.words import words


def test_a_word_of_the_minimum_length_is_kept():
    assert words("$short_text") == $short_words
'''),
        Defect("tie_order", 1, "counts",
               "top() does not order ties alphabetically: `top('$tie_text', 2)` is $tie_bad; it should be $tie_top.",
               bug=(("counts", "    return sorted(frequencies(text).items(), key=lambda item: (-item[1], item[0]))[:k]\n",
                     "    return sorted(frequencies(text).items(), key=lambda item: -item[1])[:k]\n"),),
               tests='''from $pkg.counts import top


def test_ties_in_alphabetical_order():
    assert top("$tie_text", 2) == $tie_top
'''),
        Defect("count_stop_words", 2, "counts",
               "frequencies() leaves stop words out, but the word-count report needs every word of at least "
               "MIN_LENGTH letters: `frequencies('$stop_text')` has no '$stop'; it should count it twice.",
               bug=(("counts", "from $pkg.normalize import clean\nfrom $pkg.words import MIN_LENGTH, pairs\n",
                     "from $pkg.words import pairs, words\n"),
                    ("counts", '    """How often each word of at least MIN_LENGTH letters occurs '
                               '(stop words counted too)."""\n'
                               "    found = {}\n    for w in clean(text).split():\n        if len(w) >= MIN_LENGTH:\n"
                               "            found[w] = found.get(w, 0) + 1\n",
                     '    """How often each word of words(text) occurs."""\n'
                     "    found = {}\n    for w in words(text):\n        found[w] = found.get(w, 0) + 1\n")),
               naive=(("words", "if len(w) >= MIN_LENGTH and w not in STOPWORDS]", "if len(w) >= MIN_LENGTH]"),),
               tests='''from $pkg.counts import frequencies


def test_stop_words_are_counted():
    assert frequencies("$stop_text") == $stop_freq
'''),
        Defect("word_pairs", 3, "counts",
               "Count word pairs: add `pairs(text)` to `$pkg/words.py`, each two neighbouring words of "
               "`words(text)` as a tuple, and `top_pairs(text, k)` to `$pkg/counts.py`, the k most frequent pairs "
               "with their counts, ordered as `top` orders words.",
               bug=(("words", '\n\ndef pairs(text):\n    """Each two neighbouring words of words(text), in order."""\n'
                              "    found = words(text)\n    return list(zip(found, found[1:]))\n", ""),
                    ("counts", "from $pkg.words import MIN_LENGTH, pairs\n", "from $pkg.words import MIN_LENGTH\n"),
                    ("counts", '\n\ndef top_pairs(text, k):\n'
                               '    """The k most frequent neighbouring pairs of words with their counts, ordered as top '
                               'orders words."""\n    found = {}\n    for pair in pairs(text):\n'
                               "        found[pair] = found.get(pair, 0) + 1\n"
                               "    return sorted(found.items(), key=lambda item: (-item[1], item[0]))[:k]\n", "")),
               tests='''from $pkg.counts import top_pairs
from $pkg.words import pairs


def test_pairs():
    assert pairs("$pair_text") == $pairs


def test_top_pairs():
    assert top_pairs("$pair_text", 2) == $top_pairs
'''),
    ))

FAMILIES = (TOKENIZER,)
