"""Judge examples about typesetting: one value written two ways, or two values written alike.

:mod:`genrm_judge_train.examples` dresses a reference the way a policy's reasoning ends (boxed,
in a sentence, after a change of mind). Answer-equivalence sets, and users' own pairs, also
compare bare answers typeset differently: ``.4`` and ``0.4``, ``\\dfrac13`` and ``1/3``,
``\\textbf{(C)}`` and ``C``, ``bmatrix`` and ``pmatrix``, ``x \\ge 5`` and ``5 \\leq x``,
``918\\frac12`` and ``918.5``, ``\\text{Evelyn}`` and ``Evelyn``, ``2x+1+x^2`` and ``x^2+2x+1``,
``x = 5`` or ``x = 1, x = 3`` for the value or the root set, ``28\\%`` and ``28 percent`` or
``0.28``, ``y = `` in front of the same expression, or the same string inside ``$ ... $`` /
``\\( ... \\)`` / ``\\[ ... \\]``. A judge that has seen few of these says 0 to whatever looks
unfamiliar. This module makes such pairs, balanced: each family gives the reference, equivalent
forms (verdict 1) and near misses in the same typesetting (verdict 0: a sign, a digit, another
letter, one matrix entry, a coefficient).

Deterministic in (problems, seed); the questions come from the problems (or
:data:`~genrm_judge_train.examples.NO_QUESTION`), the values from the seeded generator, never
from an evaluation set.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from fractions import Fraction

from genrm_judge_train.examples import NO_QUESTION, JudgeExample, Problem

__all__ = ["Family", "FamilyList", "make_format_examples"]

#: (reference, [(form name, equivalent answer)], [(miss name, different answer)])
Family = tuple[str, list[tuple[str, str]], list[tuple[str, str]]]


def _wrappers(text: str, rng: random.Random) -> list[tuple[str, str]]:
    """The same answer in the math-mode delimiters answer sets use (spaces and newlines too)."""
    pad = rng.choice([" ", "", "\n"])
    return [
        ("identical", text),
        ("dollar", f"${pad}{text}{pad}$"),
        ("display", f"\\[{pad}{text}{pad}\\]"),
        ("inline", f"\\({pad}{text}{pad}\\)"),
        ("double_dollar", f"$${pad}{text}{pad}$$"),
        ("boxed", f"\\boxed{{{text}}}"),
    ]


def _int_family(rng: random.Random) -> Family:
    n = rng.choice([rng.randint(-20, 20), rng.randint(21, 999), rng.randint(1000, 99999)])
    label = rng.choice([str(n), f"${n}$"])
    same = _wrappers(str(n), rng)
    if abs(n) >= 1000:
        same += [("thousands_comma", f"{n:,}"), ("thousands_space", f"{n:,}".replace(",", " "))]
    k = rng.randint(2, 9)
    a = rng.randint(1, 9)
    same += [
        ("trailing_zero", f"{n}.0"),
        ("sum", f"({n - a}+{a})"),
        ("unreduced", f"\\frac{{{n * k}}}{{{k}}}"),
    ]
    misses = [
        ("off_by_one", str(n + rng.choice([-1, 1]))),
        ("tiny_decimal", f"{n}.001"),
        ("times_ten", str(n * 10) if n else "10"),
        ("sum_off", f"({n - a}+{a + 1})"),
    ]
    if n:
        misses.append(("sign", str(-n)))
    digits = str(abs(n))
    swapped = digits[::-1].lstrip("0") or "0"
    if swapped != digits:
        misses.append(("reversed", ("-" if n < 0 else "") + swapped))
    return label, same, misses


def _decimal_family(rng: random.Random) -> Family:
    q = rng.choice([2, 4, 5, 8, 10, 20, 25])
    p = rng.randint(1, q - 1)
    value = Fraction(p, q)
    text = f"{float(value):.10g}"  # 0.4, 0.35, 0.125
    label = rng.choice([text, f"${text}$"])
    same = [
        *_wrappers(text, rng),
        ("no_leading_zero", text[1:]),
        ("trailing_zero", f"{text}0"),
        ("fraction", f"\\frac{{{value.numerator}}}{{{value.denominator}}}"),
        ("slash", f"{value.numerator}/{value.denominator}"),
        ("unreduced", f"\\frac{{{value.numerator * 3}}}{{{value.denominator * 3}}}"),
    ]
    step = Fraction(1, q)
    wrong = value + step if value + step < 1 else value - step if value > step else value / 2
    misses = [
        ("digit", f"{float(wrong):.10g}"),
        ("sign", f"-{text}"),
        ("no_leading_zero_digit", f"{float(wrong):.10g}"[1:]),
        ("inverted", f"\\frac{{{value.denominator}}}{{{value.numerator}}}"),
        ("times_ten", f"{float(value * 10):.10g}"),
    ]
    return label, same, misses


def _money_family(rng: random.Random) -> Family:
    dollars, cents = rng.randint(1000, 99999), rng.randint(1, 99)
    text = f"{dollars}.{cents:02d}"
    label = text
    same = [
        ("identical", text),
        ("dollar_sign", f"\\${text}"),
        ("thousands", f"{dollars:,}.{cents:02d}"),
        ("money", f"\\${dollars:,}.{cents:02d}"),
    ]
    misses = [
        ("cents_off", f"{dollars}.{(cents % 99) + 1:02d}"),
        ("money_cents_off", f"\\${dollars:,}.{(cents % 99) + 1:02d}"),
        ("dollars_off", f"{dollars + 1:,}.{cents:02d}"),
        ("no_cents", f"{dollars:,}"),
    ]
    return label, same, misses


def _fraction_family(rng: random.Random) -> Family:
    while True:
        p, q = rng.randint(1, 12), rng.randint(2, 13)
        if Fraction(p, q).denominator == q and p != q:
            break
    sign = rng.choice(["", "", "-"])
    latex = f"{sign}\\frac{{{p}}}{{{q}}}"
    label = rng.choice([latex, f"{sign}{p}/{q}", f"${latex}$"])
    same = [
        *_wrappers(latex, rng),
        ("dfrac", f"{sign}\\dfrac{{{p}}}{{{q}}}"),
        ("tfrac", f"{sign}\\tfrac{{{p}}}{{{q}}}"),
        ("slash", f"{sign}{p}/{q}"),
        ("unreduced", f"{sign}\\frac{{{2 * p}}}{{{2 * q}}}"),
    ]
    if p < 10 and q < 10:
        same.append(("shorthand", f"{sign}\\frac{p}{q}"))
    other = "" if sign else "-"
    misses = [
        ("inverted", f"{sign}\\frac{{{q}}}{{{p}}}"),
        ("sign", f"{other}\\frac{{{p}}}{{{q}}}"),
        ("numerator_off", f"{sign}\\dfrac{{{p + 1}}}{{{q}}}"),
        ("denominator_off", f"{sign}{p}/{q + 1}"),
    ]
    return label, same, misses


def _letter_family(rng: random.Random) -> Family:
    letters = "ABCDE"
    c = rng.choice(letters)
    d = rng.choice([x for x in letters if x != c])
    label = rng.choice([c, f"({c})", f"\\text{{{c}}}"])

    def dressed(x: str) -> list[tuple[str, str]]:
        return [
            ("bare", x),
            ("paren", f"({x})"),
            ("text", f"\\text{{{x}}}"),
            ("mathrm", f"\\mathrm{{{x}}}"),
            ("textbf", f"\\textbf{{{x}}}"),
            ("textbf_paren", f"\\textbf{{({x})}}"),
            ("option", f"{x})"),
        ]

    return label, dressed(c), [(f"other_letter_{n}", t) for n, t in dressed(d)]


def _matrix(rows: list[list[int]], env: str, sep: str) -> str:
    body = " \\\\ ".join(sep.join(str(v) for v in row) for row in rows)
    return f"\\begin{{{env}}}{body}\\end{{{env}}}"


def _matrix_family(rng: random.Random) -> Family:
    n = rng.choice([2, 3])
    rows = [[rng.randint(-5, 9) for _ in range(n)] for _ in range(n)]
    label = _matrix(rows, "pmatrix", "&")
    same = [
        ("identical", label),
        ("bmatrix", _matrix(rows, "bmatrix", " & ")),
        ("spaced", _matrix(rows, "pmatrix", " & ")),
    ]
    changed = [list(r) for r in rows]
    i, j = rng.randrange(n), rng.randrange(n)
    changed[i][j] += rng.choice([-1, 1])
    misses = [("entry_off", _matrix(changed, "pmatrix", "&")),
              ("bmatrix_entry_off", _matrix(changed, "bmatrix", " & "))]  # fmt: skip
    transposed = [list(c) for c in zip(*rows, strict=True)]
    if transposed != rows:
        misses.append(("transposed", _matrix(transposed, "pmatrix", "&")))
    return label, same, misses


def _term(coef: int, power: int, var: str) -> str:
    mono = {0: "", 1: var}.get(power, f"{var}^{power}")
    if power == 0:
        return str(coef)
    return mono if coef == 1 else f"-{mono}" if coef == -1 else f"{coef}{mono}"


def _poly(terms: Sequence[tuple[int, int]], var: str, spaced: bool) -> str:
    out = ""
    for k, (coef, power) in enumerate(terms):
        t = _term(coef, power, var)
        if k and not t.startswith("-"):
            t = "+" + t
        out += (" " + t[0] + " " + t[1:]) if spaced and k else t
    return out


def _polynomial_family(rng: random.Random) -> Family:
    var = rng.choice("xyzrt")
    a = rng.randint(1, 6)
    terms = [(1, 2), (2 * a, 1), (a * a, 0)]  # (var + a)^2, written out
    label = _poly(terms, var, spaced=False)
    if rng.random() < 0.3:
        label = f"y = {label}"
    shuffled = terms[:]
    while shuffled == terms:
        rng.shuffle(shuffled)
    same = [
        ("identical", _poly(terms, var, spaced=False)),
        ("spaced", _poly(terms, var, spaced=True)),
        ("reordered", _poly(shuffled, var, spaced=rng.random() < 0.5)),
        ("square", f"({var}+{a})^2"),
        ("product", f"({var}+{a})({var}+{a})"),
    ]
    off = [(1, 2), (2 * a + 1, 1), (a * a, 0)]
    misses = [
        ("coefficient_off", _poly(off, var, spaced=False)),
        ("constant_sign", _poly([(1, 2), (2 * a, 1), (-a * a, 0)], var, spaced=True)),
        ("square_sign", f"({var}-{a})^2"),
        ("product_off", f"({var}+{a})({var}+{a + 1})"),
    ]
    return label, same, misses


def _approx_family(rng: random.Random) -> Family:
    k = rng.choice([2, 3, 5, 6, 7])
    d = rng.choice([2, 3, 4, 5])
    exact = f"\\frac{{\\sqrt{{{k}}}}}{{{d}}}"
    approx = f"{(k**0.5) / d:.3f}"
    label = exact
    same = [
        ("identical", exact),
        ("with_approximation", f"{exact} \\approx {approx}"),
        ("dfrac", f"\\dfrac{{\\sqrt{{{k}}}}}{{{d}}}"),
    ]
    other = rng.choice([x for x in (2, 3, 5, 6, 7) if x != k])
    misses = [
        ("radicand_off", f"\\frac{{\\sqrt{{{other}}}}}{{{d}}}"),
        (
            "radicand_off_approx",
            f"\\frac{{\\sqrt{{{other}}}}}{{{d}}} \\approx {(other**0.5) / d:.3f}",
        ),
        ("no_root", f"\\frac{{{k}}}{{{d}}}"),
    ]
    return label, same, misses


_GREATER = {False: (">", ["\\gt", ">"]), True: ("\\geq", ["\\geq", "\\ge", ">=", "≥"])}
_LESS = {False: ("<", ["\\lt", "<"]), True: ("\\leq", ["\\leq", "\\le", "<=", "≤"])}


def _inequality_family(rng: random.Random) -> Family:
    """``x \\geq 5``: the other spellings of the sign, the bound written first, the interval."""
    var, b = rng.choice("xyntk"), rng.randint(-9, 20)
    closed, greater = rng.random() < 0.6, rng.random() < 0.5
    same_sign, flip_sign = (_GREATER, _LESS) if greater else (_LESS, _GREATER)
    sign, spellings = same_sign[closed]
    label = rng.choice([f"{var} {sign} {b}", f"${var} {sign} {b}$", f"{var} {spellings[-2]} {b}"])
    same = [(f"sign_{i}", f"{var} {s} {b}") for i, s in enumerate(spellings)]
    same.append(("bound_first", f"{b} {flip_sign[closed][0]} {var}"))
    bracket = ("[" if closed else "(") if greater else ("]" if closed else ")")
    same.append(
        ("interval", f"[{b}, \\infty)" if bracket == "[" else f"({b}, \\infty)")
        if greater
        else ("interval", f"(-\\infty, {b}]" if bracket == "]" else f"(-\\infty, {b})")
    )
    misses = [
        ("direction", f"{var} {flip_sign[closed][0]} {b}"),
        ("strictness", f"{var} {same_sign[not closed][0]} {b}"),
        ("bound_off", f"{var} {rng.choice(spellings)} {b + rng.choice([-1, 1])}"),
        ("bound_first_direction", f"{b} {sign} {var}"),
    ]
    return label, same, misses


_WORDS = ("Evelyn", "Carla", "Tuesday", "odd", "even", "north", "yes", "blue", "Alice", "square")


def _word_family(rng: random.Random) -> Family:
    """A word answer (a name, a day, parity): the same word in any text command or case."""
    word = rng.choice(_WORDS)
    other = rng.choice([w for w in _WORDS if w != word])
    label = rng.choice([word, f"\\text{{{word}}}", f"$\\text{{{word}}}$"])
    same = [
        ("bare", word),
        ("text", f"\\text{{{word}}}"),
        ("textbf", f"\\textbf{{{word}}}"),
        ("mathrm", f"\\mathrm{{{word}}}"),
        ("case", word.lower() if word[0].isupper() else word.capitalize()),
    ]
    i = rng.randrange(len(word))
    misses = [
        ("other_word", other),
        ("other_word_text", f"\\text{{{other}}}"),
        ("misspelt", word[: i + 1] + word[i] + word[i + 1 :]),
        ("dropped_letter", word[:i] + word[i + 1 :]),
    ]
    return label, same, [m for m in misses if m[1].lower() != word.lower()]


def _mixed_family(rng: random.Random) -> Family:
    """A mixed number ``918\\frac{1}{2}``: its decimal and improper forms are the same value."""
    whole, q = rng.randint(1, 999), rng.choice([2, 4, 5, 8])
    p = rng.choice([k for k in range(1, q) if Fraction(k, q).denominator == q])
    value = whole + Fraction(p, q)
    label = rng.choice([f"{whole}\\frac{{{p}}}{{{q}}}", f"{whole} \\frac{{{p}}}{{{q}}}"])
    same = [
        ("identical", f"{whole}\\frac{{{p}}}{{{q}}}"),
        ("decimal", f"{float(value):.10g}"),
        ("improper", f"\\frac{{{value.numerator}}}{{{value.denominator}}}"),
        ("slash", f"{value.numerator}/{value.denominator}"),
    ]
    other = value + Fraction(1, q) if p + 1 < q else value - Fraction(1, q)
    misses = [
        ("decimal_off", f"{float(other):.10g}"),
        ("whole_only", str(whole)),
        ("product", f"{float(whole * Fraction(p, q)):.10g}"),
        ("improper_off", f"\\frac{{{value.numerator + 1}}}{{{value.denominator}}}"),
    ]
    return label, same, misses


def _equation_family(rng: random.Random) -> Family:
    """An answer written as the equation that solves for it (``x = 5``), or a root set written as
    equations, in any order: the value is the answer, the variable's name is dress."""
    var = rng.choice("xyzabnt")
    if rng.random() < 0.5:
        v = rng.randint(-30, 30)
        label = rng.choice([str(v), f"${v}$"])
        same = [
            ("equation", f"{var} = {v}"),
            ("equation_tight", f"{var}={v}"),
            ("boxed_equation", f"\\boxed{{{var} = {v}}}"),
            ("value", str(v)),
        ]
        misses = [
            ("equation_off", f"{var} = {v + rng.choice([-1, 1])}"),
            ("equation_times_two", f"{var} = {2 * v if v else 2}"),
        ]
        if v:
            misses.append(("equation_sign", f"{var} = {-v}"))
        return label, same, misses
    a, b = rng.sample(range(-12, 13), 2)
    c = rng.choice([k for k in range(-12, 13) if k not in (a, b)])
    label = rng.choice([f"{a}, {b}", f"\\{{{a}, {b}\\}}"])
    same = [
        ("roots", f"{var} = {a}, {var} = {b}"),
        ("roots_or", f"{var} = {a} \\text{{ or }} {var} = {b}"),
        ("reordered", f"{b}, {a}"),
        ("member_of", f"{var} \\in \\{{{a}, {b}\\}}"),
    ]
    misses = [
        ("one_root", f"{var} = {a}"),
        ("root_off", f"{var} = {a}, {var} = {c}"),
        ("other_pair", f"{b}, {c}"),
    ]
    return label, same, misses


def _percent_family(rng: random.Random) -> Family:
    """A percentage: the sign spelt out or typeset, or the same share as a decimal."""
    n = rng.randint(1, 99)
    label = rng.choice([f"{n}\\%", f"${n}\\%$"])
    same = [
        ("percent_sign", f"{n}%"),
        ("spaced", f"{n} \\%"),
        ("word", f"{n} percent"),
        ("text_word", f"{n}\\text{{ percent}}"),
        ("share", f"{n / 100:.10g}"),
    ]
    misses = [
        ("off_by_one", f"{n + 1}\\%"),
        ("tenth", f"{n / 10:.10g}\\%"),
        ("share_off", f"{n / 1000:.10g}"),
        ("complement", f"{100 - n}\\%"),
    ]
    return label, same, [m for m in misses if m[1] != f"{n}\\%"]


#: (name, builder, weight) of each family a draw picks from
FamilyList = list[tuple[str, Callable[[random.Random], Family], float]]

_FAMILIES: FamilyList = [
    ("int", _int_family, 0.25),
    ("decimal", _decimal_family, 0.15),
    ("money", _money_family, 0.05),
    ("fraction", _fraction_family, 0.15),
    ("letter", _letter_family, 0.12),
    ("matrix", _matrix_family, 0.08),
    ("polynomial", _polynomial_family, 0.12),
    ("approx", _approx_family, 0.08),
    ("inequality", _inequality_family, 0.08),
    ("word", _word_family, 0.06),
    ("mixed", _mixed_family, 0.05),
    ("equation", _equation_family, 0.08),
    ("percent", _percent_family, 0.05),
]


def make_format_examples(
    problems: Sequence[Problem],
    n: int,
    *,
    seed: int,
    no_question_rate: float = 0.4,
    families: FamilyList | None = None,
) -> list[JudgeExample]:
    """``n`` examples, half of them equivalent, as a bare answer, an ``Answer:`` line or a
    sentence; a share ``no_question_rate`` carries :data:`NO_QUESTION`. ``families`` replaces
    the typesetting families (e.g. ``answer_forms.ANSWER_FORM_FAMILIES``)."""
    if not problems:
        raise ValueError("make_format_examples needs at least one problem")
    drawn = _FAMILIES if families is None else families
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        problem = rng.choice(problems)
        question = NO_QUESTION if rng.random() < no_question_rate else problem.question
        name, build, _ = rng.choices(drawn, weights=[w for *_, w in drawn])[0]
        label, same, misses = build(rng)
        want = rng.random() < 0.5
        form, answer = rng.choice(same if want else misses)
        shape = rng.choice(["bare", "answer_line", "answer_line", "sentence"])
        response = {
            "bare": rng.choice(["", " "]) + answer,
            "answer_line": f"Answer: {answer}",
            "sentence": f"The answer is {answer}.",
        }[shape]
        kind = f"format/{name}/{form if want else 'miss:' + form}"
        out.append(JudgeExample(question, label, response, int(want), kind))
    return out
