"""State a teaching claim, check it on this machine, print one line that says exactly what was checked.

Two kinds of numbers reach a notebook's output:

- exact facts (shapes, dtypes, counts, error messages), the same on every machine the course makes its outputs
  on, the CPU (an error message can read differently on another device): printed as they are;
- measured figures (losses, accuracies, times, ratios), whose digits depend on the CPU's SIMD width,
  the thread count and the device: printed through `measured()`, which marks them with '≈'.
  The sanitize file that strict nbval uses masks those, plus memory addresses and progress bars, and nothing else.

What a measured figure is for, a claim decides with a bound that holds on every machine:
`claim_measured("test accuracy", acc, "in [0.80, 0.95]")` prints `✔ test accuracy: ≈0.8495 in [0.80, 0.95]`.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

MEASURED = "≈"  # the mark of a machine-dependent figure; tests/nbval_sanitize.cfg masks what follows it


class ClaimFailed(AssertionError):
    """A statement the course makes did not hold on this machine."""


def measured(value: float | int, digits: int = 4) -> str:
    """A machine-dependent figure as text: '≈' and `digits` significant digits, or from 1e4 to 1e15 the rounded
    integer with thousands separators (masked by nbval)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"measured() takes a number, got {type(value).__name__} (call .item() on a tensor)")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return f"{MEASURED}{value}"
    if 1e4 <= abs(value) < 1e15 and digits <= 15:  # large figures read better with separators than in e-notation
        return f"{MEASURED}{round(value):,}"
    return f"{MEASURED}{value:.{digits}g}"


def format_seconds(seconds: float) -> str:
    """A duration in the unit that reads best: ns, µs, ms or s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def measured_seconds(seconds: float) -> str:
    """A measured duration in the unit that reads best, marked as measured: '≈12.3 ms'."""
    number, unit = format_seconds(seconds).split(" ")
    return f"{MEASURED}{number} {unit}"


def exact(value: object) -> str:
    """A figure that is the same on every machine, as text (ints with thousands separators)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return str(value)
    return f"{value:,}"


def show(value: object) -> str:
    """The one display rule for figures and checks: floats are measured, everything else is exact.

    Pass float(n) to mark a machine-dependent count as measured; pass a str to show a float exactly.
    """
    if isinstance(value, float):
        return measured(value)
    return exact(value)


_COMPARISONS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
                "<": operator.lt, ">": operator.gt}
_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_BOUND = re.compile(
    rf"^(?:(?P<op><=|>=|==|!=|<|>)\s*(?P<rhs>{_NUMBER}|'[^']*'|\"[^\"]*\")"
    rf"|in \[\s*(?P<lo>{_NUMBER})\s*,\s*(?P<hi>{_NUMBER})\s*\]"
    rf"|is (?P<truth>True|False)"
    rf"|contains (?P<needle>'[^']*'|\"[^\"]*\"))$")


def _parse_literal(text: str) -> float | str:
    return text[1:-1] if text[:1] in ("'", '"') else float(text)


@dataclass(frozen=True)
class Check:
    """One named statement about a value and the bound it must meet, e.g. Check("R²", 0.01, "< 0.5").

    Bounds: '< x', '<= x', '> x', '>= x', '== x', '!= x' (a number or a 'quoted string'),
    'in [lo, hi]' (closed), 'is True', 'is False', "contains 'text'". The bound text is printed as
    written and parsed to decide, so the printed bound is the bound tested. The `what` text is the
    caller's to keep honest, and a value of the wrong kind for its bound (a string against a number,
    a bool against a number) never holds, so such a check printed with "not" tests nothing.
    """

    what: str
    value: object
    bound: str

    def __post_init__(self) -> None:
        if not isinstance(self.what, str) or not self.what.strip():
            raise ValueError("Check needs `what` as a non-empty string")
        if not isinstance(self.bound, str) or not _BOUND.match(self.bound.strip()):
            raise ValueError(f"Check({self.what!r}): bound {self.bound!r} is not one of '< x', '<= x', '> x', "
                             "'>= x', '== x', '!= x', 'in [lo, hi]', 'is True', 'is False', \"contains 'text'\"")
        if hasattr(self.value, "item") and not isinstance(self.value, (int, float, str, bool)):
            raise TypeError(f"Check({self.what!r}): pass a plain number (call .item() on tensors)")

    @property
    def holds(self) -> bool:
        """Whether the value meets the bound."""
        m = _BOUND.match(self.bound.strip())
        value = self.value
        if m["truth"]:
            return value is (m["truth"] == "True")
        if m["needle"]:
            return isinstance(value, str) and _parse_literal(m["needle"]) in value
        if isinstance(value, bool):
            return False  # a truth value against a number bound is a mistake in the check, never a pass
        if m["lo"]:
            return isinstance(value, (int, float)) and float(m["lo"]) <= value <= float(m["hi"])
        rhs = _parse_literal(m["rhs"])
        if isinstance(rhs, str) != isinstance(value, str):
            return False
        if isinstance(value, float) and math.isnan(value):
            return m["op"] == "!="
        return bool(_COMPARISONS[m["op"]](value, rhs))

    def line(self) -> str:
        """The statement with its value: 'what: ≈0.01 < 0.5', 'what: ≈0.9, not < 0.5',
        "what: ok, without 'x'"."""
        shown = f"{self.what}: {show(self.value)}"
        if self.bound.startswith("is "):
            return shown  # the value itself says True or False
        if self.holds:
            return f"{shown} {self.bound}"
        if self.bound.strip().startswith("contains "):   # 'not contains' is not English
            return f"{shown}, without {self.bound.strip()[len('contains '):]}"
        return f"{shown}, not {self.bound}"


def claim(statement: str, holds: bool, evidence: str = "") -> None:
    """Assert a teaching claim about exact facts and print one ✔ line; raise ClaimFailed if it does not hold.

    Put measured figures in `evidence` through measured(); to bound a measured figure, use claim_measured.
    """
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError("claim() needs the statement as a non-empty string")
    if not isinstance(holds, bool):
        # bool() accepts a one-element tensor or a numpy bool; a multi-element tensor (often a
        # broadcast mistake) has no single truth value and is refused.
        try:
            holds = bool(holds)
        except Exception as exc:  # a multi-element tensor, say
            raise TypeError(f"claim({statement!r}): 'holds' must be a single truth value, "
                            f"got {type(holds).__name__}") from exc
    suffix = f"  [{evidence}]" if evidence else ""
    if not holds:
        raise ClaimFailed(f"claim does not hold on this machine: {statement}{suffix}")
    print(f"✔ {statement}{suffix}")


def claim_measured(what: str, value: float | int | bool | str, bound: str) -> None:
    """Assert that a value meets a bound and print '✔ what: ≈value bound'; raise ClaimFailed otherwise."""
    check = Check(what, value, bound)
    if not check.holds:
        raise ClaimFailed(f"claim does not hold on this machine: {check.line()}")
    print(f"✔ {check.line()}")

