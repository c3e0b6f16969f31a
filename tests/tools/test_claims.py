"""The output convention: measured figures are marked and masked, checks print exactly what they test."""
import re
from pathlib import Path

import pytest
from nbval.plugin import get_sanitize_patterns

from ptlab import Check, ClaimFailed, claim, claim_measured, measured, measured_seconds
from ptlab.claims import show

SANITIZE = Path(__file__).parents[1] / "nbval_sanitize.cfg"


def sanitize(text: str) -> str:
    """What strict nbval compares, after the course's sanitize rules, read the way nbval reads them."""
    for regex, replace in get_sanitize_patterns(SANITIZE.read_text(encoding="utf-8")):
        text = re.sub(regex, replace, text)
    return text


def test_sanitize_file_is_ascii():
    SANITIZE.read_text(encoding="ascii")  # nbval opens it in the locale's encoding


def test_measured_figures_are_marked():
    assert measured(0.849512) == "≈0.8495"
    assert measured(2) == "≈2"
    assert measured(123456.7) == "≈123,457"
    assert measured(float("nan")) == "≈nan"
    assert measured(3.3e-7) == "≈3.3e-07"
    assert measured_seconds(0.0123) == "≈12.3 ms"
    with pytest.raises(TypeError, match="item"):
        measured("0.5")


def test_display_rule_floats_measured_everything_else_exact():
    assert show(0.5) == "≈0.5" and show(12345) == "12,345" and show(True) == "True" and show("x") == "x"


def test_sanitize_masks_measured_figures_and_their_padding_only():
    here = "accuracy ≈0.8495    fixed ≈1.2e-05 s; 3 of 4 batches; shape (64, 3)\n"
    there = "accuracy ≈0.85      fixed ≈1.3e-05 s; 3 of 4 batches; shape (64, 3)\n"
    assert sanitize(here) == sanitize(there)
    assert "3 of 4 batches; shape (64, 3)" in sanitize(here), "exact facts must stay compared"
    assert sanitize("4 batches") != sanitize("5 batches")
    assert sanitize("ratio ≈3.2x") == sanitize("ratio ≈12x") == "ratio ~MEASURED~ x"
    assert sanitize("took ≈900 µs, then") == sanitize("took ≈3.6 ms, then") == "took ~MEASURED~ , then"
    assert sanitize("in ≈14 steps") == "in ~MEASURED~ steps", "a unit-like word is not a unit"
    # a comma after a figure is the text's, whether the figure has decimals or not; inside one it groups thousands
    assert sanitize("up ≈0, down ≈0.0125, others") == sanitize("up ≈0.0125, down ≈0, others") \
        == "up ~MEASURED~ , down ~MEASURED~ , others"
    assert sanitize("≈123,457 images") == sanitize("≈9 images") == "~MEASURED~ images"


@pytest.mark.parametrize("value, bound, holds", [
    (0.3, "< 0.5", True), (0.7, "< 0.5", False), (0.5, "<= 0.5", True), (3, "> 2.5", True),
    (0.85, "in [0.80, 0.95]", True), (0.96, "in [0.80, 0.95]", False), (True, "is True", True),
    (1, "is True", False), ("RuntimeError: view size", "contains 'view size'", True),
    ("RuntimeError", "== 'RuntimeError'", True), ("Can't get attribute", 'contains "Can\'t get"', True),
    (float("nan"), "> 0", False), (float("nan"), "!= 0", True),
    (True, "> 0", False), (0, "== 0", True), (1e-3, ">= 1e-3", True),
])
def test_check_decides_by_the_bound_it_prints(value, bound, holds):
    assert Check("x", value, bound).holds is holds


def test_check_lines_say_what_was_tested():
    assert Check("R² on training data", 0.0123, "< 0.5").line() == "R² on training data: ≈0.0123 < 0.5"
    assert Check("R² on training data", 0.9987, "< 0.5").line() == "R² on training data: ≈0.9987, not < 0.5"
    assert Check("outputs have a grad_fn", False, "is True").line() == "outputs have a grad_fn: False"
    assert Check("rows changed", 32, "> 0").line() == "rows changed: 32 > 0"
    assert Check("error", "no error", "contains 'NaN'").line() == "error: no error, without 'NaN'"
    assert Check("error", "got NaN", "contains 'NaN'").line() == "error: got NaN contains 'NaN'"


def test_check_rejects_bounds_it_cannot_decide():
    for bound in ("about 10%", "< half", "between 1 and 2", ""):
        with pytest.raises(ValueError, match="bound"):
            Check("x", 1.0, bound)


def test_claims_print_one_line_or_raise(capsys):
    claim("exact fact", True)
    claim_measured("test accuracy", 0.8495, "in [0.8, 0.95]")
    assert capsys.readouterr().out == "✔ exact fact\n✔ test accuracy: ≈0.8495 in [0.8, 0.95]\n"
    with pytest.raises(ClaimFailed, match="≈0.5, not > 0.8"):
        claim_measured("test accuracy", 0.5, "> 0.8")
