"""Chapter 5's remedies fixture: a clear error on an unknown remedy; the plain run is the pitfall's buggy run."""
import pytest

from ptlab.course.pitfalls import get_pitfall
from ptlab.lessons.ch05_checkpoints_debugging.regularisation import train_with_remedy


def test_an_unknown_remedy_is_named():
    with pytest.raises(ValueError, match="remedy must be one of .*'batch norm'"):
        train_with_remedy("batch norm")


def test_no_remedy_and_early_stopping_reproduce_the_pitfall_both_ways():
    pitfall = get_pitfall("overfitting-without-regularisation")
    for remedy, buggy in (("none", True), ("early stopping", False)):
        figures = pitfall.run(buggy).figures
        run = train_with_remedy(remedy)
        assert run["training accuracy"] == figures["training accuracy"]
        assert run["held-out accuracy"] == figures["held-out accuracy"]
