"""Two ``repo`` families about times and lengths: a scheduler of bookings, a unit converter.

See :mod:`tempering.tasks.repo_families` for what a family and a defect are. As in
:mod:`tempering.tasks.repo_families_money`, every expected value is computed here, and the
modules' own tests stay clear of the edges the level-1 defects sit on.
"""

from __future__ import annotations

import random

from tempering.tasks.repo_families import Defect, Params, RepoFamily


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _scheduler(rng: random.Random) -> Params:
    maxlen, gap = rng.randint(60, 240), rng.randint(5, 30)
    s1 = rng.randint(6 * 60, 12 * 60)
    len1 = rng.randint(15, maxlen - 1)
    e1 = s1 + len1
    s2 = s1 + rng.randint(1, len1 - 1)
    s3 = e1 + gap + rng.randint(5, 60)
    late = rng.randint(22 * 60, 23 * 60 + 59)
    wrap = rng.randint(10, 300)
    lenm = rng.randint(15, maxlen - 1)
    t1 = rng.randint(0, 24 * 60 - 1)
    times = {"s1": s1, "e1": e1, "s2": s2, "e2": s2 + rng.randint(10, maxlen - 1), "s3": s3,
             "e3": s3 + rng.randint(10, maxlen - 1), "elong": s1 + maxlen + 1, "emax": s1 + maxlen,
             "e4": e1 + rng.randint(10, maxlen - 1), "sm": 24 * 60 - lenm, "g1": e1 + gap - 1,
             "g2": e1 + gap - 1 + len1, "g3": e1 + gap, "g4": e1 + gap + len1, "t1": t1, "late": late}
    p: Params = {name: _hhmm(value) for name, value in times.items()}
    p.update(maxlen=maxlen, gap=gap, len1=len1, t1m=t1, tomid=24 * 60 - late, tomid2=24 * 60 - late + wrap,
             wrapped=_hhmm(wrap), bad_midnight="00:00")
    return p


SCHEDULER = RepoFamily(
    name="scheduler",
    summary="Booking slots of a day.",
    packages=("planner", "agenda", "timetable", "rota", "dispatch", "roster"),
    draw=_scheduler,
    modules={
        "clock": '''"""Times of day as minutes after midnight."""

DAY = 24 * 60


def parse(text):
    """The minutes after midnight of 'HH:MM'."""
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def fmt(minutes):
    """'HH:MM' of minutes after midnight, on a 24-hour clock (1500 is '01:00')."""
    minutes %= DAY
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def shift(text, minutes):
    """The time minutes after text ('23:30' and 45 give '00:15')."""
    return fmt(parse(text) + minutes)
''',
        "slots": '''"""Bookable slots of a day."""

from $pkg.clock import parse

MAX_MINUTES = $maxlen
GAP = $gap
"""Minutes kept free between two bookings."""


class Slot:
    """From start to end ('HH:MM'), at most MAX_MINUTES long."""

    def __init__(self, start, end):
        self.start, self.end = parse(start), parse(end)
        if self.end <= self.start:
            raise ValueError("a slot ends after it starts")
        if self.minutes() > MAX_MINUTES:
            raise ValueError(f"a slot is at most {MAX_MINUTES} minutes")

    def minutes(self):
        return self.end - self.start

    def overlaps(self, other, gap=0):
        """True when the slots share a minute, or are less than gap minutes apart."""
        return self.start < other.end + gap and other.start < self.end + gap
''',
        "bookings": '''"""A day's bookings."""

from $pkg.clock import DAY, fmt
from $pkg.slots import GAP, Slot


class Bookings:
    def __init__(self):
        self.slots = []

    def book(self, start, end):
        """Book start to end; False (nothing booked) when it comes within GAP minutes of a booking."""
        slot = Slot(start, end)
        if any(slot.overlaps(other, GAP) for other in self.slots):
            return False
        self.slots.append(slot)
        return True

    def busy_minutes(self):
        return sum(slot.minutes() for slot in self.slots)

    def agenda(self):
        """'HH:MM-HH:MM' of each booking in time order (a booking to midnight ends '24:00')."""
        return [f"{fmt(s.start)}-{'24:00' if s.end == DAY else fmt(s.end)}"
                for s in sorted(self.slots, key=lambda s: s.start)]
'''},
    tests={
        "clock": '''from $pkg.clock import fmt, parse, shift


def test_parse_and_fmt():
    assert parse("$t1") == $t1m
    assert fmt($t1m) == "$t1"


def test_shift_wraps_past_midnight():
    assert shift("$late", $tomid) == "00:00"
    assert shift("$late", $tomid2) == "$wrapped"
''',
        "slots": '''from $pkg.slots import MAX_MINUTES, Slot


def test_a_slot_has_minutes():
    assert Slot("$s1", "$e1").minutes() == $len1


def test_a_slot_longer_than_the_maximum_is_refused():
    try:
        Slot("$s1", "$elong")
    except ValueError:
        pass
    else:
        raise AssertionError("a slot longer than MAX_MINUTES was made")
    assert MAX_MINUTES == $maxlen


def test_overlapping_slots():
    assert Slot("$s1", "$e1").overlaps(Slot("$s2", "$e2"))
    assert not Slot("$s1", "$e1").overlaps(Slot("$s3", "$e3"))
''',
        "bookings": '''from $pkg.bookings import Bookings


def test_book_and_refuse_an_overlap():
    day = Bookings()
    assert day.book("$s1", "$e1")
    assert not day.book("$s2", "$e2")
    assert day.busy_minutes() == $len1


def test_the_agenda_is_in_time_order():
    day = Bookings()
    assert day.book("$s3", "$e3")
    assert day.book("$s1", "$e1")
    assert day.agenda() == ["$s1-$e1", "$s3-$e3"]
'''},
    defects=(
        Defect("touching_slots", 1, "slots",
               "Back-to-back slots count as overlapping: `Slot('$s1', '$e1').overlaps(Slot('$e1', '$e4'))` is "
               "True, though one ends at $e1 when the other starts.",
               bug=(("slots", "        return self.start < other.end + gap and other.start < self.end + gap\n",
                     "        return self.start <= other.end + gap and other.start <= self.end + gap\n"),),
               tests='''from $pkg.slots import Slot


def test_touching_slots_do_not_overlap():
    assert not Slot("$s1", "$e1").overlaps(Slot("$e1", "$e4"))
    assert not Slot("$e1", "$e4").overlaps(Slot("$s1", "$e1"))
'''),
        Defect("longest_slot", 1, "slots",
               "A slot of exactly MAX_MINUTES ($maxlen) is refused: `Slot('$s1', '$emax')` raises ValueError, "
               "though it is not longer than the maximum.",
               bug=(("slots", "        if self.minutes() > MAX_MINUTES:\n", "        if self.minutes() >= MAX_MINUTES:\n"),),
               tests='''from $pkg.bookings import Bookings
from $pkg.slots import Slot


def test_a_slot_of_the_maximum_length():
    assert Slot("$s1", "$emax").minutes() == $maxlen
    assert Bookings().book("$s1", "$emax")
'''),
        Defect("ends_at_midnight", 2, "bookings",
               "The agenda shows a booking that ends at midnight as ending at 00:00: after `book('$sm', '24:00')`, "
               "`agenda()` is ['$sm-00:00']; it should be ['$sm-24:00'].",
               bug=(("bookings", "-{'24:00' if s.end == DAY else fmt(s.end)}\"", '-{fmt(s.end)}"'),),
               naive=(("clock", "    minutes %= DAY\n", "    if minutes != DAY:\n        minutes %= DAY\n"),),
               tests='''from $pkg.bookings import Bookings


def test_a_booking_to_midnight_ends_at_24():
    day = Bookings()
    assert day.book("$sm", "24:00")
    assert day.agenda() == ["$sm-24:00"]
'''),
        Defect("booking_gap", 3, "bookings",
               "Keep a gap between bookings: `$pkg/slots.py` should define `GAP = $gap` (minutes), "
               "`Slot.overlaps(other, gap=0)` should count slots less than gap minutes apart as overlapping, and "
               "`Bookings.book` should refuse a booking that comes within GAP minutes of another.",
               bug=(("slots", 'GAP = $gap\n"""Minutes kept free between two bookings."""\n', ""),
                    ("slots", "    def overlaps(self, other, gap=0):\n"
                              '        """True when the slots share a minute, or are less than gap minutes apart."""\n'
                              "        return self.start < other.end + gap and other.start < self.end + gap\n",
                     "    def overlaps(self, other):\n"
                     '        """True when the slots share a minute."""\n'
                     "        return self.start < other.end and other.start < self.end\n"),
                    ("bookings", "from $pkg.slots import GAP, Slot\n", "from $pkg.slots import Slot\n"),
                    ("bookings", "when it comes within GAP minutes of a booking", "when it overlaps a booking"),
                    ("bookings", "slot.overlaps(other, GAP)", "slot.overlaps(other)")),
               tests='''from $pkg.bookings import Bookings
from $pkg.slots import Slot


def test_the_gap_is_a_constant_of_slots():
    from $pkg.slots import GAP

    assert GAP == $gap


def test_overlaps_counts_the_gap():
    assert Slot("$s1", "$e1").overlaps(Slot("$g1", "$g2"), $gap)
    assert not Slot("$s1", "$e1").overlaps(Slot("$g3", "$g4"), $gap)


def test_book_keeps_the_gap():
    day = Bookings()
    assert day.book("$s1", "$e1")
    assert not day.book("$g1", "$g2")
    assert day.book("$g3", "$g4")
'''),
    ))


CUSTOM_UNITS = ("span", "cubit", "hand", "rod", "pace", "ell")
UNKNOWN_UNITS = ("furlong", "league", "fathom", "mile", "chain")


def _converter(rng: random.Random) -> Params:
    digits, factor = rng.randint(2, 4), rng.randint(50, 2000)
    v1, v2 = rng.randint(1, 999), rng.randint(1, 99)
    x = round(rng.uniform(1, 100), 6)
    p: Params = {"unit": rng.choice(CUSTOM_UNITS), "factor": factor, "badfactor": factor * 10, "digits": digits,
                 "bogus": rng.choice(UNKNOWN_UNITS), "v1": v1, "v1cm": repr(v1 * 1000 / 10), "v2": v2,
                 "v2m": repr(v2 * 1000000 / 1000), "x": repr(x), "xs": f"{round(x, digits)} cm",
                 "v1in": f"{round(v1 * 25.4 / 10, digits)} cm", "a1": v2, "a1in": f"{round(v2 * 1000 / 25.4, digits)} in",
                 "a1mm": repr(v2 * 25.4)}
    return p


CONVERTER = RepoFamily(
    name="converter",
    summary="Lengths in units, converted and shown.",
    packages=("measure", "gauge", "metric", "scales", "yardstick", "ruler"),
    draw=_converter,
    modules={
        "table": '''"""Lengths: the millimetres in one of each unit."""

FACTORS = {"mm": 1, "cm": 10, "m": 1000, "km": 1000000, "in": 25.4, "ft": 304.8, "$unit": $factor}
ALIASES = {"metre": "m", "meter": "m", "inch": "in", "foot": "ft", "feet": "ft"}


class UnknownUnit(KeyError, ValueError):
    """A unit not in FACTORS: a ValueError, and a KeyError for callers that look units up."""


def canonical(unit):
    """The unit's name in FACTORS (an alias resolved)."""
    return ALIASES.get(unit, unit)


def factor(unit):
    """Millimetres in one unit; UnknownUnit for one not in FACTORS."""
    unit = canonical(unit)
    if unit not in FACTORS:
        raise UnknownUnit(unit)
    return FACTORS[unit]
''',
        "convert": '''"""Converting lengths between units."""

from $pkg.table import factor


def convert(value, source, target):
    """value in source units, in target units; a ValueError for a negative length."""
    if value < 0:
        raise ValueError("a length is not negative")
    return value * factor(source) / factor(target)
''',
        "display": '''"""Lengths shown to people."""

from $pkg.convert import convert
from $pkg.table import canonical

DIGITS = $digits


def show(value, unit):
    """'2.54 cm': value rounded to DIGITS places, and its unit."""
    return f"{round(value, DIGITS)} {canonical(unit)}"


def show_in(value, source, target):
    """value in source units shown in target units; '? target' when a unit is unknown."""
    try:
        return show(convert(value, source, target), target)
    except KeyError:
        return f"? {target}"
'''},
    tests={
        "table": '''from $pkg.table import FACTORS, factor


def test_factors():
    assert factor("m") == 1000 and factor("in") == 25.4
    assert FACTORS["km"] == 1000000


def test_an_unknown_unit_is_a_key_error():
    try:
        factor("$bogus")
    except KeyError:
        pass
    else:
        raise AssertionError("an unknown unit has a factor")
''',
        "convert": '''from $pkg.convert import convert


def test_convert():
    assert convert($v1, "m", "cm") == $v1cm
    assert convert($v2, "km", "m") == $v2m


def test_a_negative_length_is_refused():
    try:
        convert(-$v1, "m", "cm")
    except ValueError:
        pass
    else:
        raise AssertionError("converted a negative length")
''',
        "display": '''from $pkg.display import show, show_in


def test_show_rounds():
    assert show($x, "cm") == "$xs"


def test_show_in():
    assert show_in($v1, "in", "cm") == "$v1in"


def test_an_unknown_unit_is_shown_as_a_question_mark():
    assert show_in(1, "$bogus", "m") == "? m"
'''},
    defects=(
        Defect("zero_length", 1, "convert",
               "A length of zero is refused: `convert(0, 'm', 'cm')` raises ValueError; zero is not negative.",
               bug=(("convert", "    if value < 0:\n", "    if value <= 0:\n"),),
               tests='''from $pkg.convert import convert


def test_zero_converts_to_zero():
    assert convert(0, "m", "cm") == 0
    assert convert(0, "$unit", "in") == 0
'''),
        Defect("custom_factor", 1, "table",
               "A $unit is $factor mm, but `convert(1, '$unit', 'mm')` gives $badfactor.0.",
               bug=(("table", '"$unit": $factor}', '"$unit": $badfactor}'),),
               tests='''from $pkg.convert import convert


def test_the_custom_unit():
    assert convert(1, "$unit", "mm") == $factor
    assert convert($factor, "mm", "$unit") == 1
'''),
        Defect("unknown_unit", 2, "table",
               "Converting with an unknown unit raises a bare KeyError: `convert(1, '$bogus', 'm')` should raise a "
               "ValueError that names the unit.",
               bug=(("table", "class UnknownUnit(KeyError, ValueError):\n"
                              '    """A unit not in FACTORS: a ValueError, and a KeyError for callers that look units up."""'
                              "\n\n\n", ""),
                    ("table", "UnknownUnit for one not in FACTORS", "a KeyError for one not in FACTORS"),
                    ("table", "    if unit not in FACTORS:\n        raise UnknownUnit(unit)\n", "")),
               naive=(("table", "    return FACTORS[unit]\n",
                       "    if unit not in FACTORS:\n        raise ValueError(f\"unknown unit {unit!r}\")\n"
                       "    return FACTORS[unit]\n"),),
               tests='''from $pkg.convert import convert


def test_an_unknown_unit_is_a_value_error():
    try:
        convert(1, "$bogus", "m")
    except ValueError as exc:
        assert "$bogus" in str(exc)
    else:
        raise AssertionError("converted an unknown unit")
'''),
        Defect("unit_aliases", 3, "display",
               "Accept unit aliases: `$pkg/table.py` should map 'metre' and 'meter' to 'm', 'inch' to 'in', 'foot' "
               "and 'feet' to 'ft' (an `ALIASES` dict and a `canonical(unit)` function), `convert` should take "
               "them, and `show` should print the unit's own name (`show(1.5, 'metre')` is '1.5 m').",
               bug=(("table", 'ALIASES = {"metre": "m", "meter": "m", "inch": "in", "foot": "ft", "feet": "ft"}\n', ""),
                    ("table", "def canonical(unit):\n"
                              '    """The unit\'s name in FACTORS (an alias resolved)."""\n'
                              "    return ALIASES.get(unit, unit)\n\n\n", ""),
                    ("table", "    unit = canonical(unit)\n", ""),
                    ("display", "from $pkg.table import canonical\n", ""),
                    ("display", "{canonical(unit)}", "{unit}")),
               tests='''from $pkg.convert import convert
from $pkg.display import show, show_in


def test_aliases_convert():
    assert convert($a1, "inch", "mm") == $a1mm
    assert convert($a1, "metre", "cm") == convert($a1, "m", "cm")


def test_show_prints_the_unit_itself():
    assert show(1.5, "metre") == "1.5 m"
    assert show_in($a1, "meter", "inch") == "$a1in"
'''),
    ))

FAMILIES = (SCHEDULER, CONVERTER)
