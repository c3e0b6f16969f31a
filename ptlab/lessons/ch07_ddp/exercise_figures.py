"""What chapter 7's checkers compare answers with: the right answers' outputs (and typical
wrong ones') on the checks' fixed inputs. Written by `python tests/answers/test_stored_figures.py`
from the answers in tests/answers, which the handout leaves out; not edited by hand."""

FIGURES = {
    "ch7-ring-allreduce-seconds": {
        "seconds": [1.0, 0.3, 0.000175, 0.0, 0.4]
    }
}
