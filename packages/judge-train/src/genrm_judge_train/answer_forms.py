"""Judge examples about the shape of an answer: the same value stated another way.

:mod:`genrm_judge_train.format_examples` dresses one value in other typesetting. Answer sets
also state a value in another *form*: the label names what it solves for (``(p,q)=(3,2)``,
``|AB| = 1``, ``V_1:V_2 = 11:21``) and the answer gives the bare value; a worked chain ends at
the value (``x = 5+5+1 = 11``: the last value counts, not the first); an inequality multiplied
by -1; an interval as the inequality it stands for; a fraction as its long decimal; a set of
solutions in another order or boxed one by one; ``\\pm a`` as both roots; a unit or a degree
sign after the number; the terms of a sum in another order; thousands grouped with ``{,}``. A
judge that has not seen these says 0 to each. The near misses keep the form and change the value
(a bound, a sign, one tuple, the last value of the chain), so the form alone decides nothing.

These families are an option of :func:`~genrm_judge_train.format_examples.make_format_examples`
(``families=ANSWER_FORM_FAMILIES``), not part of its default mix: a seed's default pairs stay the
pairs the shipped judge was trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction

from genrm_judge_train.format_examples import Family

__all__ = ["ANSWER_FORM_FAMILIES", "CONTRAST_FAMILIES"]


def _value(rng: random.Random) -> tuple[str, str]:
    """A value and a different one of the same kind (an integer or a fraction)."""
    if rng.random() < 0.7:
        n = rng.randint(-40, 99)
        return str(n), str(n + rng.choice([-2, -1, 1, 2, 10]))
    p, q = rng.randint(1, 11), rng.randint(2, 12)
    while Fraction(p, q).denominator != q:
        p, q = rng.randint(1, 11), rng.randint(2, 12)
    return f"\\frac{{{p}}}{{{q}}}", f"\\frac{{{q}}}{{{p}}}" if p != 1 else f"\\frac{{2}}{{{q}}}"


def _named_family(rng: random.Random) -> Family:
    """The label says what it solves for; the answer is the bare value (or the reverse)."""
    if rng.random() < 0.35:  # an ordered pair named by its variables
        a, b = rng.sample(range(-9, 15), 2)
        names = rng.choice(["(p,q)", "(x, y)", "(a,b)", "(m, n)"])
        value, swapped, off = f"({a},{b})", f"({b},{a})", f"({a},{b + 1})"
        spaced = f"({a}, {b})"
        named = f"{names}={value}" if rng.random() < 0.5 else f"{names} = {spaced}"
        same = [
            ("bare", value),
            ("spaced", spaced),
            ("named", named),
            ("boxed", f"\\boxed{{{value}}}"),
        ]
        misses = [
            ("swapped", swapped),
            ("entry_off", off),
            ("named_swapped", f"{names} = {swapped}"),
        ]
        return rng.choice([named, f"${named}$"]), same, misses
    if rng.random() < 0.2:  # a ratio named by its quantities
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        while Fraction(a, b).denominator != b or a == b:
            a, b = rng.randint(1, 30), rng.randint(1, 30)
        name = rng.choice(["V_{1}:V_{2}", "A:B", "r_1 : r_2"])
        label = f"{name}={a}:{b}"
        same = [("bare", f"{a}:{b}"), ("spaced", f"{a} : {b}"), ("named", f"{name} = {a}:{b}")]
        misses = [("inverted", f"{b}:{a}"), ("term_off", f"{a}:{b + 1}")]
        return rng.choice([label, f"${label}$"]), same, misses
    value, other = _value(rng)
    name = rng.choice(["x", "k", "n", "|AB|", "a_{1}", "AB", "m", "S", "P(A)"])
    named = f"{name} = {value}"
    if rng.random() < 0.5:  # the name on the label's side
        label = rng.choice([named, f"{name}={value}", f"${named}$"])
        same = [("bare", value), ("boxed", f"\\boxed{{{value}}}"), ("named", named)]
    else:  # the name on the answer's side
        label = rng.choice([value, f"${value}$"])
        same = [
            ("named", named),
            ("named_tight", f"{name}={value}"),
            ("boxed", f"\\boxed{{{named}}}"),
        ]
    misses = [("other", other), ("named_other", f"{name} = {other}")]
    return label, same, misses


def _chain_family(rng: random.Random) -> Family:
    """A worked chain of equalities: the value it ends at is the answer. A chain that passes
    through the label and ends elsewhere is a miss."""
    var = rng.choice("xyzn")
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
    v = a * b + c
    label = rng.choice([str(v), f"{var} = {v}", f"${var} = {v}$", f"${v}$"])
    same = [
        ("chain", f"{var} = {a} \\cdot {b} + {c} = {a * b} + {c} = {v}"),
        ("chain_short", f"{var} = {a * b}+{c} = {v}"),
        ("chain_bare", f"{a}\\times {b} + {c} = {v}"),
        # a slip in the middle of the working, but the chain still ends at the value
        ("chain_slip", f"{var} = {a * b}+{c} = {v + rng.choice([-3, -1, 2])} = {v}"),
    ]
    w = v + rng.choice([-2, -1, 1, 3])
    misses = [
        ("chain_past", f"{var} = {a * b}+{c} = {v} + 1 = {v + 1}"),
        ("chain_off", f"{var} = {a} \\cdot {b} + {c} = {w}"),
        ("chain_ends_elsewhere", f"{var} = {v} = {w}"),
    ]
    return label, same, misses


def _negated_family(rng: random.Random) -> Family:
    """``-x > -b`` is ``x < b``: an inequality multiplied through by -1 flips its sign."""
    var, b = rng.choice("xytk"), rng.randint(1, 20)
    closed = rng.random() < 0.5
    less, greater = ("\\le", "\\ge") if closed else ("<", ">")
    less_ascii, greater_ascii = ("<=", ">=") if closed else ("<", ">")
    label = rng.choice(
        [f"{var} {less} {b}", f"${var} {less_ascii} {b}$", f"{var} {less_ascii} {b}"]
    )
    same = [
        ("negated", f"-{var} {greater} -{b}"),
        ("negated_ascii", f"-{var} {greater_ascii} -{b}"),
        ("bound_first", f"{b} {greater} {var}"),
    ]
    misses = [
        ("negated_unflipped", f"-{var} {less} -{b}"),
        ("negated_bound_sign", f"-{var} {greater} {b}"),
        ("flipped", f"{var} {greater} {b}"),
    ]
    return label, same, misses


def _interval_family(rng: random.Random) -> Family:
    """An interval, and the inequality or membership it stands for."""
    a = rng.randint(-9, 9)
    b = a + rng.randint(1, 12)
    left, right = rng.choice([("[", ")"), ("(", "]"), ("[", "]"), ("(", ")")])
    text = f"{left}{a},{b}{right}"
    label = rng.choice([text, f"${text}$", f"{left}{a}, {b}{right}"])
    var = rng.choice("xtyz")
    low = "\\le" if left == "[" else "<"
    high = "\\le" if right == "]" else "<"
    same = [
        ("identical", text),
        ("dollar", f"${text}$"),
        ("spaced", f"{left}{a}, {b}{right}"),
        ("left_right", f"\\left{left}{a}, {b}\\right{right}"),
        ("member", f"{var} \\in {left}{a}, {b}{right}"),
        ("inequality", f"{a} {low} {var} {high} {b}"),
    ]
    other_left = "(" if left == "[" else "["
    misses = [
        ("left_bracket", f"{other_left}{a},{b}{right}"),
        ("bound_off", f"{left}{a},{b + 1}{right}"),
        ("inequality_off", f"{a} {low} {var} {high} {b + 1}"),
        ("member_other", f"{var} \\in {other_left}{a}, {b}{right}"),
    ]
    return label, same, misses


def _long_decimal_family(rng: random.Random) -> Family:
    """A fraction whose decimal repeats, written out to 10-16 places (alone or in a tuple)."""
    q = rng.choice([3, 6, 7, 9, 11, 12, 13, 15])
    p = rng.choice([k for k in range(1, q) if Fraction(k, q).denominator == q])
    places = rng.randint(10, 16)
    decimal = f"{p / q:.{places}f}"
    frac = f"\\frac{{{p}}}{{{q}}}"
    other = Fraction(p, q) + Fraction(1, q) if p + 1 < q else Fraction(p - 1, q)
    if rng.random() < 0.3:  # inside a pair, the other entry a plain integer
        n = rng.randint(-5, 9)
        label = f"({n},{frac})"
        same = [("tuple_decimal", f"({n},{decimal})"), ("tuple_spaced", f"({n}, {decimal})")]
        misses = [
            ("tuple_decimal_off", f"({n},{float(other):.{places}f})"),
            ("tuple_entry_off", f"({n + 1},{decimal})"),
        ]
        return label, same, misses
    label = rng.choice([frac, f"${frac}$", f"{p}/{q}"])
    same = [("decimal", decimal), ("decimal_dollar", f"${decimal}$")]
    misses = [
        ("decimal_off", f"{float(other):.{places}f}"),
        ("times_ten", f"{10 * p / q:.{places}f}"),
        ("short", f"{p / q:.2f}"),
    ]
    return label, same, [m for m in misses if m[1] != decimal]


def _solution_set_family(rng: random.Random) -> Family:
    """A set of solutions (ordered pairs): any order, each boxed, joined by "and"; one pair
    changed or left out is a miss."""
    k = rng.randint(2, 4)
    pairs: list[tuple[int, int]] = []
    while len(pairs) < k:
        pair = (rng.randint(-9, 12), rng.randint(-9, 12))
        if pair not in pairs:
            pairs.append(pair)

    def join(ps: list[tuple[int, int]], spaced: bool = False) -> str:
        return ", ".join(f"({a}, {b})" if spaced else f"({a},{b})" for a, b in ps)

    label = rng.choice([join(pairs), f"${join(pairs, True)}$"])
    shuffled = pairs[:]
    while shuffled == pairs:
        rng.shuffle(shuffled)
    boxed = [f"\\boxed{{({a}, {b})}}" for a, b in shuffled]
    same = [
        ("reordered", join(shuffled, rng.random() < 0.5)),
        ("boxed_each", ", ".join(boxed)),
        (
            "boxed_and",
            " \\text{ and } ".join(boxed)
            if k == 2
            else ", ".join(boxed[:-1]) + " and " + boxed[-1],
        ),
        ("boxed_all", f"\\boxed{{{join(shuffled, True)}}}"),
    ]
    changed = [list(p) for p in shuffled]
    changed[0][1] += rng.choice([-1, 1])
    misses = [
        ("one_left_out", join(shuffled[:-1], True)),
        ("entry_off", ", ".join(f"({a}, {b})" for a, b in changed)),
        ("one_left_out_boxed", ", ".join(boxed[1:])),
    ]
    return label, same, [m for m in misses if all(m[1] != s for _, s in same)]


def _plus_minus_family(rng: random.Random) -> Family:
    """``\\pm a``: both signs listed, in either order or as a set or root equations."""
    a = rng.choice([str(rng.randint(1, 40)), f"\\sqrt{{{rng.choice([2, 3, 5, 6, 7, 10])}}}"])
    var = rng.choice("xyz")
    label = rng.choice([f"\\pm {a}", f"$\\pm {a}$", f"{var} = \\pm {a}"])
    same = [
        ("both", f"-{a}, {a}"),
        ("both_reordered", f"{a}, -{a}"),
        ("set", f"\\{{-{a}, {a}\\}}"),
        ("roots", f"{var} = {a} \\text{{ or }} {var} = -{a}"),
        ("pm", f"{var} = \\pm {a}"),
    ]
    b = f"{int(a) + 1}" if a.isdigit() else "\\sqrt{11}"
    misses = [
        ("positive_only", a),
        ("negative_only", f"-{a}"),
        ("pm_off", f"\\pm {b}"),
        ("both_off", f"-{b}, {b}"),
    ]
    return label, same, misses


_UNITS = ("units", "cm", "meters", "dollars", "square units", "degrees", "minutes", "any text")


def _unit_family(rng: random.Random) -> Family:
    """A number with a unit or a degree sign after it, and the bare number."""
    n = rng.randint(1, 360)
    if rng.random() < 0.3:
        label = rng.choice([f"{n}^\\circ", f"${n}^\\circ$", f"{n}^{{\\circ}}"])
        same = [("bare", str(n)), ("degree", f"{n}^\\circ"), ("degree_word", f"{n} degrees")]
        misses = [("off", str(n + 1)), ("degree_off", f"{n + 10}^\\circ")]
        return label, same, misses
    unit = rng.choice(_UNITS)
    label = rng.choice([f"{n}\\text{{ {unit}}}", f"{n} \\text{{{unit}}}", f"${n}$ {unit}"])
    same = [
        ("bare", str(n)),
        ("text", f"{n}\\text{{ {unit}}}"),
        ("plain_unit", f"{n} {unit}"),
        ("thin_space", f"{n}\\,\\text{{{unit}}}"),
    ]
    misses = [
        ("off", str(n + rng.choice([-1, 1, 10]))),
        ("text_off", f"{n * 2}\\text{{ {unit}}}"),
    ]
    return label, same, misses


def _commuted_family(rng: random.Random) -> Family:
    """The terms of a sum in another order, a fraction split over its numerator, an equation
    multiplied by -1; a changed sign or a term left outside the fraction is a miss."""
    a, b = rng.randint(1, 20), rng.randint(2, 9)
    k = rng.choice([2, 3, 5, 6, 7, 10, 11])
    var = rng.choice("xyt")
    shape = rng.randrange(3)
    if shape == 0:
        label = f"{a}+{b}\\sqrt{{{k}}}"
        same = [("commuted", f"{b}\\sqrt{{{k}}}+{a}"), ("spaced", f"{a} + {b}\\sqrt{{{k}}}")]
        misses = [("sign", f"{b}\\sqrt{{{k}}}-{a}"), ("radicand", f"{a}+{b}\\sqrt{{{k + 1}}}")]
    elif shape == 1:
        d = rng.choice([3, 5, 7, 9, 11])
        label = f"\\frac{{{var}+{a}}}{{{d}}}"
        same = [
            ("split", f"\\frac{{{var}}}{{{d}}}+\\frac{{{a}}}{{{d}}}"),
            ("commuted", f"\\frac{{{a}+{var}}}{{{d}}}"),
        ]
        misses = [
            ("outside", f"\\frac{{{var}}}{{{d}}}+{a}"),
            ("sign", f"\\frac{{{var}-{a}}}{{{d}}}"),
        ]
    else:
        c1, c2 = rng.randint(2, 40), rng.randint(2, 40)
        label = f"{c1}x+{c2}y-{a}=0"
        same = [("negated", f"-{c1}x-{c2}y+{a}=0"), ("commuted", f"{c2}y+{c1}x-{a}=0")]
        misses = [("one_sign", f"-{c1}x-{c2}y-{a}=0"), ("coefficient", f"{c1}x+{c2 + 1}y-{a}=0")]
    return rng.choice([label, f"${label}$"]), same, misses


def _grouped_family(rng: random.Random) -> Family:
    """Thousands grouped with ``{,}`` or ``,\\!``; a comma and a space make a list, not a number."""
    n = rng.randint(10_000, 99_999_999)
    grouped = f"{n:,}"
    label = rng.choice([str(n), f"${n}$"])
    same = [
        ("braced", grouped.replace(",", "{,}")),
        ("negative_space", grouped.replace(",", ",\\!")),
        ("boxed_braced", f"\\boxed{{{grouped.replace(',', '{,}')}}}"),
    ]
    off = n + rng.choice([1, 10, 1000])
    misses = [
        ("braced_off", f"{off:,}".replace(",", "{,}")),
        ("list", grouped.replace(",", ", ")),
    ]
    return label, same, misses


#: (name, builder, weight): the families :func:`make_format_examples` draws with
#: ``families=ANSWER_FORM_FAMILIES``.
ANSWER_FORM_FAMILIES: list[tuple[str, Callable[[random.Random], Family], float]] = [
    ("named", _named_family, 0.18),
    ("chain", _chain_family, 0.10),
    ("negated", _negated_family, 0.07),
    ("interval", _interval_family, 0.12),
    ("long_decimal", _long_decimal_family, 0.09),
    ("solution_set", _solution_set_family, 0.12),
    ("plus_minus", _plus_minus_family, 0.08),
    ("unit", _unit_family, 0.08),
    ("commuted", _commuted_family, 0.10),
    ("grouped", _grouped_family, 0.06),
]


def _terminating_decimal_family(rng: random.Random) -> Family:
    """A fraction whose decimal ends (``0.5`` is ``\\frac12``): the counterpart of the long
    decimals' short miss (``0.33`` for ``\\frac13`` is a 0), so that the judge tells a decimal
    that is the value from one that only begins it."""
    q = rng.choice([2, 4, 5, 8, 16, 20, 25])
    p = rng.choice([k for k in range(1, 2 * q) if Fraction(k, q).denominator == q])
    exact = f"{p / q:g}"
    label = rng.choice([f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}", f"\\frac {{{p}}}{{{q}}}"])
    same = [("decimal", exact), ("decimal_dollar", f"${exact}$"), ("boxed", f"\\boxed{{{exact}}}")]
    misses = [
        ("digit_off", f"{(p + 1) / q:g}"),
        ("inverted", f"{q / p:g}"),
        ("truncated", exact[:-1] if len(exact.rstrip("0")) > 3 else f"{p / q + 0.1:g}"),
    ]
    return label, same, [m for m in misses if m[1] not in (exact, "", "0.", "1.")]


def _equation_label_family(rng: random.Random) -> Family:
    """A label that is an equation among several unknowns (``2x+z=1``): its right side alone is
    not the answer (unlike a name for the value, ``k = 1``); the same equation reordered is."""
    u, w = rng.sample("xyzab", 2)
    c = rng.randint(2, 9)
    v = rng.randint(-9, 20)
    label = rng.choice([f"{c}{u}+{w}={v}", f"${c}{u} + {w} = {v}$"])
    same = [
        ("identical", f"{c}{u}+{w}={v}"),
        ("reordered", f"{w}+{c}{u}={v}"),
        ("spaced", f"{c}{u} + {w} = {v}"),
    ]
    misses = [
        ("right_side", str(v)),
        ("right_side_boxed", f"\\boxed{{{v}}}"),
        ("value_off", f"{c}{u}+{w}={v + 1}"),
        ("coefficient_off", f"{c + 1}{u}+{w}={v}"),
    ]
    return label, same, misses


def _thousands_family(rng: random.Random) -> Family:
    """A large integer with its thousands grouped by commas (``7,425,000``) is the integer; the
    same digits as a list (``7, 425, 000``) or one group changed are not."""
    n = rng.randint(100_000, 999_999_999)
    grouped = f"{n:,}"
    label = rng.choice([str(n), f"${n}$"])
    same = [
        ("comma", grouped),
        ("comma_dollar", f"${grouped}$"),
        ("braced", grouped.replace(",", "{,}")),
    ]
    off = n + rng.choice([1, 1000, 1_000_000])
    misses = [("comma_off", f"{off:,}"), ("list", grouped.replace(",", ", "))]
    return label, same, misses


#: Pairs that contrast stage 11's over-reach (``CONTRAST_FAMILIES``, ``--contrast-examples``):
#: a terminating decimal against a repeating one's prefix, an equation label against a name for
#: the value, grouped thousands against a list. Not in any shipped adapter yet.
CONTRAST_FAMILIES: list[tuple[str, Callable[[random.Random], Family], float]] = [
    ("terminating_decimal", _terminating_decimal_family, 0.4),
    ("equation_label", _equation_label_family, 0.35),
    ("thousands", _thousands_family, 0.25),
]
