"""Two ``repo`` families about text: a tokenizer (stop words, counts, word pairs) and a parser
of ``key = value`` settings.

See :mod:`tempering.tasks.repo_families` for what a family and a defect are. As in
:mod:`tempering.tasks.repo_families_money`, every expected value is computed here, and the
modules' own tests stay clear of the edges the level-1 defects sit on (a word of exactly the
minimum length, words tied in count, blank lines, an ``=`` inside a value).
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



KEYS = ("port", "host", "name", "color", "mode", "level", "limit", "path", "owner", "theme")
YES_WORDS = ("Yes", "ON", "True", "On", "YES", "TRUE")
NO_WORDS = ("No", "OFF", "False", "Off", "NO")


def _config(rng: random.Random) -> Params:
    k1, k2, k_int, k_bool, k_list = rng.sample(KEYS, 5)
    w1, w2, w3 = words(rng, 3, CONTENT_WORDS)
    n = rng.randint(2, 999)
    return {"comment": rng.choice(("#", ";")), "k1": k1, "K1": k1.upper(), "k2": k2, "V1": w1.title(),
            "v2": str(rng.randint(1, 9999)), "k_int": k_int, "k_bool": k_bool, "k_list": k_list,
            "d_int": rng.randint(1, 9999), "n2": rng.randint(1, 9999), "w1": w1, "w2": w2, "w3": w3, "W1": w1.title(),
            "bogus": rng.choice(("maybe", "perhaps", "sometimes")), "yes": rng.choice(YES_WORDS),
            "no": rng.choice(NO_WORDS), "nk": f"{n}k", "n_thousands": n * 1000, "eq_value": f"{w2}={w3}"}


CONFIG = RepoFamily(
    name="config",
    summary="Settings read from 'key = value' text.",
    packages=("confparse", "dotconf", "keyfile", "prefs", "iniread", "knobs"),
    draw=_config,
    modules={
        "values": '''"""Values of settings, read from text."""

TRUE = ("yes", "true", "on")
FALSE = ("no", "false", "off")


def to_bool(text):
    """True or False of a yes/no word, in any case; a ValueError for another word."""
    word = text.strip().lower()
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ValueError(f"not a yes/no value: {text!r}")


def to_int(text):
    """The number of text, a k suffix meaning thousands (64k is 64000)."""
    text = text.strip()
    if text.endswith("k"):
        return int(text[:-1]) * 1000
    return int(text)


def to_list(text):
    """The comma-separated items of text, each stripped; [] for an empty text."""
    return [item.strip() for item in text.split(",") if item.strip()]
''',
        "parse": '''"""Reading 'key = value' lines."""

COMMENT = "$comment"


def parse(text):
    """The settings of text as {key: value}, keys lower-cased; blank and comment lines skipped."""
    found = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(COMMENT):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line {number}: expected 'key = value'")
        found[key.strip().lower()] = value.strip()
    return found
''',
        "settings": '''"""Settings with defaults, read as numbers, flags or lists."""

from $pkg.parse import parse
from $pkg.values import to_bool, to_int, to_list

DEFAULTS = {"$k_int": "$d_int", "$k_bool": "no", "$k_list": ""}


class Settings:
    def __init__(self, text):
        self.values = {**DEFAULTS, **parse(text)}

    def number(self, key):
        return to_int(self.values[key])

    def flag(self, key):
        return to_bool(self.values[key])

    def items(self, key):
        return to_list(self.values[key])
'''},
    tests={
        "values": '''from $pkg.values import to_bool, to_list


def test_to_bool():
    assert to_bool("yes") is True and to_bool("off") is False
    try:
        to_bool("$bogus")
    except ValueError:
        pass
    else:
        raise AssertionError("read a word that is neither yes nor no")


def test_to_list():
    assert to_list("$w1, $w2 ,$w3") == ["$w1", "$w2", "$w3"]
    assert to_list("") == []
''',
        "parse": '''from $pkg.parse import parse


def test_parse():
    assert parse("$K1 = $V1\\n$comment a note\\n$k2=$v2") == {"$k1": "$V1", "$k2": "$v2"}


def test_a_line_without_equals_is_refused():
    try:
        parse("$k1 = 1\\n$k2")
    except ValueError as exc:
        assert "line 2" in str(exc)
    else:
        raise AssertionError("read a line without '='")
''',
        "settings": '''from $pkg.settings import Settings


def test_defaults():
    settings = Settings("")
    assert settings.number("$k_int") == $d_int
    assert settings.flag("$k_bool") is False and settings.items("$k_list") == []


def test_values_override_the_defaults():
    settings = Settings("$k_int = $n2\\n$k_list = $W1, $w2\\n$k_bool = on")
    assert settings.number("$k_int") == $n2 and settings.flag("$k_bool") is True
    assert settings.items("$k_list") == ["$W1", "$w2"]
'''},
    defects=(
        Defect("blank_lines", 1, "parse",
               "A blank line stops parse: `parse('$k1 = 1\\n\\n$k2 = 2')` raises \"line 2: expected 'key = value'\"; "
               "blank lines should be skipped.",
               bug=(("parse", "        if not line or line.startswith(COMMENT):\n",
                     "        if line.startswith(COMMENT):\n"),),
               tests='''from $pkg.parse import parse


def test_blank_lines_are_skipped():
    assert parse("$k1 = 1\\n\\n$k2 = 2\\n") == {"$k1": "1", "$k2": "2"}
'''),
        Defect("equals_in_value", 1, "parse",
               "A value with '=' in it is cut: `parse('$k1 = $eq_value')` gives the key '$k1 = $w2' the value "
               "'$w3'; it should be {'$k1': '$eq_value'}.",
               bug=(("parse", '        key, sep, value = line.partition("=")\n',
                     '        key, sep, value = line.rpartition("=")\n'),),
               tests='''from $pkg.parse import parse


def test_a_value_may_hold_equals():
    assert parse("$k1 = $eq_value") == {"$k1": "$eq_value"}
'''),
        Defect("flag_case", 2, "values",
               "Flags written in capitals are refused: `Settings('$k_bool = $yes').flag('$k_bool')` raises "
               "ValueError; yes/no words should be read in any case.",
               bug=(("values", "    word = text.strip().lower()\n", "    word = text.strip()\n"),
                    ("values", "a yes/no word, in any case;", "a yes/no word;")),
               naive=(("parse", "        found[key.strip().lower()] = value.strip()\n",
                       "        found[key.strip().lower()] = value.strip().lower()\n"),),
               tests='''from $pkg.settings import Settings


def test_flags_in_any_case():
    assert Settings("$k_bool = $yes").flag("$k_bool") is True
    assert Settings("$k_bool = $no").flag("$k_bool") is False
'''),
        Defect("thousands", 3, "settings",
               "Numbers with a 'k' suffix: add `to_int(text)` to `$pkg/values.py` ('$nk' is $n_thousands, "
               "'12' is 12) and make `Settings.number` read numbers with it.",
               bug=(("values", '\n\ndef to_int(text):\n'
                               '    """The number of text, a k suffix meaning thousands (64k is 64000)."""\n'
                               '    text = text.strip()\n    if text.endswith("k"):\n'
                               '        return int(text[:-1]) * 1000\n    return int(text)\n', ""),
                    ("settings", "from $pkg.values import to_bool, to_int, to_list\n",
                     "from $pkg.values import to_bool, to_list\n"),
                    ("settings", "        return to_int(self.values[key])\n", "        return int(self.values[key])\n")),
               tests='''from $pkg.settings import Settings


def test_to_int():
    from $pkg.values import to_int

    assert to_int("$nk") == $n_thousands and to_int("12") == 12


def test_number_reads_thousands():
    assert Settings("$k_int = $nk").number("$k_int") == $n_thousands
'''),
    ))

FAMILIES = (TOKENIZER, CONFIG)
