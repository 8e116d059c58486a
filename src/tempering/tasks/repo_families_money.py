"""Two ``repo`` families about money: an inventory with prices and orders, a bank ledger.

See :mod:`tempering.tasks.repo_families` for what a family and a defect are. Every test
value is computed here from the drawn constants; the templates' tests avoid the edges the
level-1 defects sit on (taking every unit, an order of exactly the bulk size, a withdrawal to
exactly the overdraft), so the modules' own tests pass before and after each fix.
"""

from __future__ import annotations

import random

from tempering.tasks.repo_families import Defect, Params, RepoFamily, search, words


def _line_total(unit: int, units: int, bulk: int, discount: int) -> int:
    total = unit * units
    return total - (total * discount + 50) // 100 if units >= bulk else total


def _inventory(rng: random.Random) -> Params:
    low, bulk, discount, tax = rng.randint(3, 12), rng.randint(10, 40), rng.randint(5, 30), rng.randint(3, 15)
    sku, sku2, sku3 = words(rng, 3)
    p: Params = {"low": low, "bulk": bulk, "discount": discount, "tax": tax, "sku": sku, "sku2": sku2, "sku3": sku3,
                 "maxo": rng.randint(61, 200), "n": rng.randint(2, 30), "unit": rng.randint(101, 999)}
    p["full_price"] = p["unit"] * bulk
    p["bulk_price"] = _line_total(p["unit"], bulk, bulk, discount)
    q2 = search(rng, bulk, bulk + 20, lambda q: q * discount % 100 != 0)
    u2 = search(rng, 101, 999, lambda u: u * q2 * discount % 100 >= 50)
    p.update(q2=q2, u2=u2, t2=u2 * q2, good2=_line_total(u2, q2, bulk, discount),
             bad2=u2 * q2 - u2 * q2 * discount // 100)
    q3 = rng.randint(bulk + 1, bulk + 9)
    u3 = search(rng, 100, 999, lambda u: u * q3 * discount % 100 < 50)
    q4, u4 = rng.randint(1, bulk - 1), rng.randint(101, 999)
    c = search(rng, 100, 9999, lambda c: c * tax % 100 >= 50)
    have = rng.randint(q4 + 1, q4 + 20)
    a = rng.randint(5, 40)
    b = rng.randint(1, a - 1)
    p.update(q3=q3, u3=u3, price3=_line_total(u3, q3, bulk, discount), q4=q4, u4=u4, price4=u4 * q4,
             c=c, taxed=c * tax // 100, have=have, have1=have + 1, left4=have - q4,
             due4=u4 * q4 + u4 * q4 * tax // 100, a=a, b=b, ab=a - b, a1=a + 1,
             high=low + rng.randint(1, 20), lowc=rng.randint(1, low - 1), reorder=repr(sorted([sku2, sku3])))
    n_total = _line_total(u4, p["n"], bulk, discount)
    p.update(due_n=n_total + n_total * tax // 100, maxo1=p["maxo"] + 1, over=p["maxo"] + 5, left_max=5)
    return p


INVENTORY = RepoFamily(
    name="inventory",
    summary="Stock, prices and orders of a store.",
    packages=("stockroom", "depot", "storekeep", "warehouse", "pantry", "supplies"),
    draw=_inventory,
    modules={
        "stock": '''"""Stock levels, one count per SKU."""

REORDER_LEVEL = $low
MAX_ORDER = $maxo


class OutOfStock(Exception):
    """More units were asked for than are in stock."""


class Stock:
    """Units in stock per SKU; an unknown SKU has none."""

    def __init__(self):
        self.levels = {}

    def add(self, sku, units):
        if units <= 0:
            raise ValueError("units must be positive")
        self.levels[sku] = self.levels.get(sku, 0) + units

    def take(self, sku, units):
        have = self.levels.get(sku, 0)
        if units > have:
            raise OutOfStock(sku)
        self.levels[sku] = have - units

    def count(self, sku):
        return self.levels.get(sku, 0)

    def needs_reorder(self, sku):
        """True when the count is at or below the reorder level."""
        return self.count(sku) <= REORDER_LEVEL
''',
        "pricing": '''"""Prices in whole cents."""

BULK_UNITS = $bulk
BULK_DISCOUNT = $discount


def percent_of(cents, percent):
    """percent % of cents, rounded down to a whole cent."""
    return cents * percent // 100


def line_total(unit_cents, units):
    """units at unit_cents each, less BULK_DISCOUNT % (rounded to the nearest cent) from BULK_UNITS units on."""
    total = unit_cents * units
    if units >= BULK_UNITS:
        total -= (total * BULK_DISCOUNT + 50) // 100
    return total
''',
        "orders": '''"""Filling orders from stock."""

from $pkg.pricing import line_total, percent_of
from $pkg.stock import MAX_ORDER, OutOfStock

TAX_RATE = $tax


def tax(cents):
    """Sales tax on cents, rounded down: no fraction of a cent is ever charged."""
    return percent_of(cents, TAX_RATE)


def fill(stock, sku, units, unit_cents):
    """Take units of sku from stock; the amount due in cents with tax, or None when refused."""
    if units > MAX_ORDER:
        return None
    try:
        stock.take(sku, units)
    except OutOfStock:
        return None
    subtotal = line_total(unit_cents, units)
    return subtotal + tax(subtotal)


def reorder_list(stock):
    """The SKUs to reorder, sorted."""
    return sorted(sku for sku in stock.levels if stock.needs_reorder(sku))
'''},
    tests={
        "stock": '''from $pkg.stock import REORDER_LEVEL, OutOfStock, Stock


def test_add_and_take():
    stock = Stock()
    stock.add("$sku", $a)
    stock.take("$sku", $b)
    assert stock.count("$sku") == $ab


def test_taking_more_than_there_is_raises():
    stock = Stock()
    stock.add("$sku", $a)
    try:
        stock.take("$sku", $a1)
    except OutOfStock:
        assert stock.count("$sku") == $a
    else:
        raise AssertionError("took more units than were in stock")


def test_an_unknown_sku_has_none():
    assert Stock().count("$sku2") == 0


def test_reorder_below_the_level():
    stock = Stock()
    stock.add("$sku", $high)
    stock.add("$sku2", $lowc)
    assert not stock.needs_reorder("$sku") and stock.needs_reorder("$sku2")
    assert REORDER_LEVEL == $low
''',
        "pricing": '''from $pkg.pricing import BULK_UNITS, line_total


def test_small_orders_pay_full_price():
    assert line_total($u4, $q4) == $price4


def test_bulk_orders_get_the_discount():
    assert line_total($u3, $q3) == $price3
    assert BULK_UNITS == $bulk
''',
        "orders": '''from $pkg.orders import fill, reorder_list, tax
from $pkg.stock import Stock


def test_tax_is_rounded_down():
    assert tax($c) == $taxed


def test_fill_charges_the_order_with_tax():
    stock = Stock()
    stock.add("$sku", $have)
    assert fill(stock, "$sku", $q4, $u4) == $due4
    assert stock.count("$sku") == $left4


def test_fill_refuses_a_short_order():
    stock = Stock()
    stock.add("$sku", $have)
    assert fill(stock, "$sku", $have1, $u4) is None
    assert stock.count("$sku") == $have


def test_reorder_list():
    stock = Stock()
    stock.add("$sku", $high)
    stock.add("$sku2", $lowc)
    stock.add("$sku3", $lowc)
    assert reorder_list(stock) == $reorder
'''},
    defects=(
        Defect("take_every_unit", 1, "stock",
               "Stock.take refuses the last units: with $n units of '$sku' in stock, `take('$sku', $n)` "
               "raises OutOfStock although all $n are there.",
               bug=(("stock", "        if units > have:\n", "        if units >= have:\n"),),
               tests='''from $pkg.orders import fill
from $pkg.stock import Stock


def test_take_every_unit():
    stock = Stock()
    stock.add("$sku", $n)
    stock.take("$sku", $n)
    assert stock.count("$sku") == 0


def test_an_order_for_every_unit_is_filled():
    stock = Stock()
    stock.add("$sku", $n)
    assert fill(stock, "$sku", $n, $u4) == $due_n
'''),
        Defect("bulk_from_bulk_units", 1, "pricing",
               "An order of exactly $bulk units gets no bulk discount: `line_total($unit, $bulk)` returns "
               "$full_price, but BULK_UNITS is $bulk, so the $discount% discount applies ($bulk_price).",
               bug=(("pricing", "    if units >= BULK_UNITS:\n", "    if units > BULK_UNITS:\n"),),
               tests='''from $pkg.pricing import line_total


def test_the_discount_starts_at_bulk_units():
    assert line_total($unit, $bulk) == $bulk_price
'''),
        Defect("discount_rounding", 2, "pricing",
               "The bulk discount is rounded down, so bulk orders are overcharged: `line_total($u2, $q2)` is $bad2, "
               "but $discount% off $t2 cents, the discount rounded to the nearest cent (halves up), is $good2.",
               bug=(("pricing", "        total -= (total * BULK_DISCOUNT + 50) // 100\n",
                     "        total -= percent_of(total, BULK_DISCOUNT)\n"),),
               naive=(("pricing", "    return cents * percent // 100\n", "    return (cents * percent + 50) // 100\n"),),
               tests='''from $pkg.pricing import line_total


def test_the_discount_is_rounded_to_the_nearest_cent():
    assert line_total($u2, $q2) == $good2
'''),
        Defect("order_limit", 3, "orders",
               "Add an order limit: `$pkg/stock.py` should define `MAX_ORDER = $maxo`, and `fill` should refuse "
               "an order of more than MAX_ORDER units (return None and take nothing), however much is in stock.",
               bug=(("stock", "REORDER_LEVEL = $low\nMAX_ORDER = $maxo\n", "REORDER_LEVEL = $low\n"),
                    ("orders", "from $pkg.stock import MAX_ORDER, OutOfStock\n", "from $pkg.stock import OutOfStock\n"),
                    ("orders", "    if units > MAX_ORDER:\n        return None\n", "")),
               tests='''from $pkg.orders import fill
from $pkg.stock import Stock


def test_the_limit_is_a_constant_of_stock():
    from $pkg.stock import MAX_ORDER

    assert MAX_ORDER == $maxo


def test_an_order_above_the_limit_is_refused():
    stock = Stock()
    stock.add("$sku", $over)
    assert fill(stock, "$sku", $maxo1, 100) is None
    assert stock.count("$sku") == $over
    assert fill(stock, "$sku", $maxo, 100) is not None
    assert stock.count("$sku") == $left_max
'''),
    ))


def _amount(cents: int) -> str:
    """'12.05' for 1205 (an amount as the ledger's to_cents reads it)."""
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


def _cents(rng: random.Random, low: int, high: int) -> int:
    """Cents whose last two digits are at least 10 (so a missing zero pad would show)."""
    return search(rng, low, high, lambda c: c % 100 >= 10)


def _ledger(rng: random.Random) -> Params:
    cur = rng.choice(("EUR", "USD", "GBP", "CHF", "SEK", "NOK"))
    overdraft, rate = rng.randint(10, 500) * 100, rng.randint(1, 9)
    d1 = _cents(rng, 2000, 90000)
    w1 = search(rng, 100, d1 - 100, lambda w: w % 100 >= 10 and (d1 - w) % 100 >= 10)
    w2 = _cents(rng, 100, overdraft - 1)
    f1 = _cents(rng, 100, 999999)
    whole, digit = rng.randint(1, 999), rng.randint(1, 9)
    c5 = rng.randint(1, 999) * 100 + rng.randint(1, 9)
    owner = rng.choice(("Ada", "Bo", "Cleo", "Dev", "Eun", "Femi"))
    p: Params = {"cur": cur, "overdraft": overdraft, "rate": rate, "owner": owner,
                 "d1": _amount(d1), "d1c": d1, "w1": _amount(w1), "w1c": w1, "bal1": d1 - w1,
                 "bal1s": f"{_amount(d1 - w1)} {cur}", "big": _amount(d1 + overdraft + rng.randint(1, 5000)),
                 "w2": _amount(w2), "w2s": f"{_amount(-w2)} {cur}", "int1": d1 * rate // 100,
                 "amt": f"{whole}.{digit}", "amt_c": whole * 100 + digit * 10, "whole": str(whole), "whole_c": whole * 100,
                 "f1": f1, "f1s": f"{_amount(f1)} {cur}",
                 "c5": c5, "c5_good": f"{_amount(c5)} {cur}", "c5_bad": f"{c5 // 100}.{c5 % 100} {cur}",
                 "limit": _amount(d1 + overdraft), "od": _amount(overdraft),
                 "d1s": f"+{_amount(d1)} {cur}", "d1_plain": f"{_amount(d1)} {cur}", "w1s": f"{_amount(-w1)} {cur}"}
    p.update(paid=p["int1"], after=d1 + p["int1"])
    return p


LEDGER = RepoFamily(
    name="ledger",
    summary="Bank accounts, their statements and interest.",
    packages=("ledger", "bankbook", "tally", "coffer", "vault", "purse"),
    draw=_ledger,
    modules={
        "money": '''"""Amounts of money in whole cents."""

CURRENCY = "$cur"


def to_cents(text):
    """The cents of an amount written '12.34', '12.3' or '12' (a leading '-' allowed)."""
    sign = -1 if text.startswith("-") else 1
    whole, _, fraction = text.lstrip("-").partition(".")
    return sign * (int(whole) * 100 + int((fraction + "00")[:2]))


def fmt(cents):
    """An amount as '12.34 $cur' ('-0.50 $cur' below zero)."""
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d} {CURRENCY}"
''',
        "accounts": '''"""Accounts: deposits, withdrawals and an overdraft limit."""

from $pkg.money import to_cents

OVERDRAFT = $overdraft
"""Cents an account may go below zero."""


class Declined(Exception):
    """A withdrawal beyond the overdraft limit."""


class Account:
    def __init__(self, owner):
        self.owner = owner
        self.balance = 0
        self.history = []

    def deposit(self, amount):
        cents = to_cents(amount)
        if cents <= 0:
            raise ValueError("a deposit must be positive")
        self.credit(cents)

    def credit(self, cents):
        """Add cents to the balance (interest, refunds)."""
        self.balance += cents
        self.history.append(cents)

    def withdraw(self, amount):
        cents = to_cents(amount)
        if self.balance - cents < -OVERDRAFT:
            raise Declined(amount)
        self.balance -= cents
        self.history.append(-cents)
''',
        "statements": '''"""Statements and interest."""

from $pkg.money import fmt

INTEREST = $rate
"""Percent a year, paid on a positive balance."""


def statement(account):
    """The owner, each movement ('+' before money in), and the balance."""
    lines = [account.owner]
    lines += [("+" if cents > 0 else "") + fmt(cents) for cents in account.history]
    lines.append("balance " + fmt(account.balance))
    return lines


def interest(account):
    """A year's interest in cents, rounded down; none on a balance at or below zero."""
    if account.balance <= 0:
        return 0
    return account.balance * INTEREST // 100


def pay_interest(account):
    """Credit the account with a year's interest; the cents paid."""
    cents = interest(account)
    if cents:
        account.credit(cents)
    return cents
'''},
    tests={
        "money": '''from $pkg.money import fmt, to_cents


def test_to_cents():
    assert to_cents("$amt") == $amt_c
    assert to_cents("-$amt") == -$amt_c
    assert to_cents("$whole") == $whole_c


def test_fmt():
    assert fmt($f1) == "$f1s"
    assert fmt(-$f1) == "-$f1s"
''',
        "accounts": '''from $pkg.accounts import Account, Declined


def test_deposit_and_withdraw():
    account = Account("$owner")
    account.deposit("$d1")
    account.withdraw("$w1")
    assert account.balance == $bal1
    assert account.history == [$d1c, -$w1c]


def test_a_withdrawal_beyond_the_overdraft_is_declined():
    account = Account("$owner")
    account.deposit("$d1")
    try:
        account.withdraw("$big")
    except Declined:
        assert account.balance == $d1c
    else:
        raise AssertionError("withdrew beyond the overdraft limit")


def test_a_deposit_must_be_positive():
    try:
        Account("$owner").deposit("0")
    except ValueError:
        pass
    else:
        raise AssertionError("deposited nothing")
''',
        "statements": '''from $pkg.accounts import Account
from $pkg.statements import interest, statement


def test_the_statement_of_a_withdrawal():
    account = Account("$owner")
    account.withdraw("$w2")
    assert statement(account) == ["$owner", "$w2s", "balance $w2s"]


def test_a_statement_ends_with_the_balance():
    account = Account("$owner")
    account.deposit("$d1")
    account.withdraw("$w1")
    assert statement(account)[-1] == "balance $bal1s"


def test_interest():
    account = Account("$owner")
    account.deposit("$d1")
    assert interest(account) == $int1
    assert interest(Account("$owner")) == 0
'''},
    defects=(
        Defect("overdraft_limit", 1, "accounts",
               "A withdrawal that takes an account exactly to its overdraft limit is declined: after "
               "`deposit('$d1')`, `withdraw('$limit')` raises Declined, though the balance, -$od, is what "
               "OVERDRAFT ($overdraft cents) allows.",
               bug=(("accounts", "        if self.balance - cents < -OVERDRAFT:\n",
                     "        if self.balance - cents <= -OVERDRAFT:\n"),),
               tests='''from $pkg.accounts import Account


def test_a_withdrawal_to_the_limit_is_allowed():
    account = Account("$owner")
    account.deposit("$d1")
    account.withdraw("$limit")
    assert account.balance == -$overdraft
'''),
        Defect("cents_padding", 1, "money",
               "fmt writes amounts whose cents are below ten wrongly: `fmt($c5)` gives '$c5_bad' instead of "
               "'$c5_good'.",
               bug=(("money", "{abs(cents) % 100:02d}", "{abs(cents) % 100}"),),
               tests='''from $pkg.money import fmt


def test_cents_below_ten_are_padded():
    assert fmt($c5) == "$c5_good"
    assert fmt(-$c5) == "-$c5_good"
'''),
        Defect("plus_for_money_in", 2, "statements",
               "Statements should mark money in: a deposit's line should read '+12.34 $cur' (withdrawals keep "
               "their '-'). After `deposit('$d1')` and `withdraw('$w1')` the movements read "
               "['$d1_plain', '$w1s']; they should be ['$d1s', '$w1s'].",
               bug=(("statements", '("+" if cents > 0 else "") + fmt(cents)', "fmt(cents)"),),
               naive=(("money", '    sign = "-" if cents < 0 else ""\n',
                       '    sign = "-" if cents < 0 else "+" if cents > 0 else ""\n'),),
               tests='''from $pkg.accounts import Account
from $pkg.statements import statement


def test_money_in_has_a_plus():
    account = Account("$owner")
    account.deposit("$d1")
    account.withdraw("$w1")
    assert statement(account)[1:-1] == ["$d1s", "$w1s"]
'''),
        Defect("pay_interest", 3, "statements",
               "Pay interest into accounts: add `Account.credit(cents)`, which adds cents to the balance and the "
               "history as a deposit does (without parsing an amount), and `pay_interest(account)` in "
               "`$pkg/statements.py`, which credits the account with `interest(account)` and returns the cents paid.",
               bug=(("accounts", '        self.credit(cents)\n\n    def credit(self, cents):\n'
                                 '        """Add cents to the balance (interest, refunds)."""\n', ""),
                    ("statements", '\n\ndef pay_interest(account):\n'
                                   '    """Credit the account with a year\'s interest; the cents paid."""\n'
                                   '    cents = interest(account)\n    if cents:\n        account.credit(cents)\n'
                                   '    return cents\n', "")),
               tests='''from $pkg.accounts import Account
from $pkg.statements import pay_interest


def test_credit_adds_cents():
    account = Account("$owner")
    account.credit($d1c)
    assert account.balance == $d1c and account.history == [$d1c]


def test_pay_interest():
    account = Account("$owner")
    account.deposit("$d1")
    assert pay_interest(account) == $paid
    assert account.balance == $after
    assert account.history == [$d1c, $paid]


def test_no_interest_on_an_empty_account():
    account = Account("$owner")
    assert pay_interest(account) == 0
    assert account.history == []
'''),
    ))

FAMILIES = (INVENTORY, LEDGER)
