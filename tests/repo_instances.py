"""Hand-made repository instances for the tests of ``env: repo`` and the ``repo`` reward.

``stock``: a package of three modules in which ``pkg.report`` depends on ``pkg.stock``, whose
``remove`` lets a quantity go below zero. Its right fix clamps the quantity; a naive fix that
deletes the emptied entry also passes the target test but breaks ``report.ship`` (the
knock-on check). ``units``: a converter whose kilometre factor is wrong, used by ``pkg.trip``.
"""

from __future__ import annotations

from tempering.rewards.repo_patch import make_patch
from tempering.rewards.repo_workspace import format_call
from tempering.tasks.repo_records import RepoInstance
from tempering.types import Problem

STOCK = '''def total(items):
    """Units in stock: the sum of a {name: quantity} dict."""
    return sum(items.values())


def remove(items, name, quantity):
    """Take ``quantity`` of ``name`` out of stock (never below zero); the quantity left."""
    left = items.get(name, 0) - quantity
    items[name] = left
    return items[name]
'''

REPORT = '''from pkg.stock import remove, total


def ship(items, order):
    """Remove each ordered item from stock; the units shipped."""
    shipped = 0
    for name, quantity in order.items():
        before = items.get(name, 0)
        remove(items, name, quantity)
        shipped += before - items[name]
    return shipped


def summary(items):
    return f"{len(items)} items, {total(items)} units"
'''

VISIBLE_STOCK_TESTS = '''from pkg.stock import remove, total


def test_total():
    assert total({"a": 2, "b": 3}) == 5


def test_remove_some():
    items = {"a": 5}
    assert remove(items, "a", 2) == 3
'''

HIDDEN_STOCK_TESTS = VISIBLE_STOCK_TESTS + '''

def test_remove_never_below_zero():
    items = {"a": 2}
    assert remove(items, "a", 5) == 0
    assert items.get("a", 0) == 0
'''

HIDDEN_REPORT_TESTS = '''from pkg.report import ship, summary


def test_ship_all():
    items = {"a": 2, "b": 1}
    assert ship(items, {"a": 2}) == 2


def test_summary():
    assert summary({"a": 2, "b": 1}) == "2 items, 3 units"
'''

FIXED_STOCK = STOCK.replace("    items[name] = left\n", "    items[name] = max(left, 0)\n")
BROKEN_STOCK = STOCK.replace("    items[name] = left\n    return items[name]\n",
                             "    if left <= 0:\n        del items[name]\n        return 0\n"
                             "    items[name] = left\n    return items[name]\n")


FIX_CALL = format_call("replace", path="pkg/stock.py", old="    items[name] = left\n",
                       new="    items[name] = max(left, 0)\n")
"""The right fix as one ``replace`` call."""


def stock_instance() -> RepoInstance:
    files = {"pkg/__init__.py": "", "pkg/stock.py": STOCK, "pkg/report.py": REPORT,
             "tests/test_stock.py": VISIBLE_STOCK_TESTS}
    return RepoInstance(
        instance_id="stock-0",
        problem_statement="remove() lets a quantity go below zero: removing 5 of 2 leaves -3. "
                          "It should stop at zero.",
        files=files,
        hidden_tests={"tests/test_stock.py": HIDDEN_STOCK_TESTS, "tests/test_report.py": HIDDEN_REPORT_TESTS},
        FAIL_TO_PASS=("tests/test_stock.py::test_remove_never_below_zero",),
        PASS_TO_PASS=("tests/test_stock.py::test_total", "tests/test_stock.py::test_remove_some",
                      "tests/test_report.py::test_ship_all", "tests/test_report.py::test_summary"),
        patch=make_patch(files, {**files, "pkg/stock.py": FIXED_STOCK}),
        meta={"module": "pkg/stock.py"})


def stock_patch(text: str) -> str:
    """A diff that makes ``pkg/stock.py`` read ``text``."""
    files = stock_instance().files
    return make_patch(files, {**files, "pkg/stock.py": text})


UNITS = '''FACTORS = {"m": 1.0, "km": 100.0, "cm": 0.01}


def to_meters(value, unit):
    return value * FACTORS[unit]
'''

TRIP = '''from pkg.units import to_meters


def trip_length(legs):
    """Metres of a trip given as (value, unit) legs."""
    return sum(to_meters(value, unit) for value, unit in legs)
'''


def units_instance() -> RepoInstance:
    files = {"pkg/__init__.py": "", "pkg/units.py": UNITS, "pkg/trip.py": TRIP,
             "tests/test_units.py": "from pkg.units import to_meters\n\n\ndef test_cm():\n"
                                    "    assert to_meters(250, 'cm') == 2.5\n"}
    hidden = {"tests/test_units.py": files["tests/test_units.py"] + "\n\ndef test_km():\n"
                                                                   "    assert to_meters(2, 'km') == 2000.0\n",
              "tests/test_trip.py": "from pkg.trip import trip_length\n\n\ndef test_metres_only():\n"
                                    "    assert trip_length([(3, 'm'), (4, 'm')]) == 7.0\n"}
    return RepoInstance(
        instance_id="units-0", problem_statement="to_meters(2, 'km') gives 200.0; a kilometre is 1000 metres.",
        files=files, hidden_tests=hidden, FAIL_TO_PASS=("tests/test_units.py::test_km",),
        PASS_TO_PASS=("tests/test_units.py::test_cm", "tests/test_trip.py::test_metres_only"),
        patch=make_patch(files, {**files, "pkg/units.py": UNITS.replace("100.0", "1000.0")}))


def problem(instance: RepoInstance, task: str = "repo") -> Problem:
    """The instance as the repo task family hands it out: its record in ``meta["repo"]``."""
    return Problem(task=task, id=instance.instance_id, prompt=instance.problem_statement + "\n", answer="",
                   meta={"repo": instance.to_record()})
