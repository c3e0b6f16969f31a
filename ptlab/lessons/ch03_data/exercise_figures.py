"""What chapter 3's checkers compare answers with: the right answers' outputs (and typical
wrong ones') on the checks' fixed inputs. Written by `python tests/answers/test_stored_figures.py`
from the answers in tests/answers, which the handout leaves out; not edited by hand."""

FIGURES = {
    "ch3-batch-count": {
        "answer": "1a0996c06520005b"
    },
    "ch3-label-lookup": {
        "lookups": [
            [1, 0, 2, 3],
            [1, 2, 0]
        ]
    }
}
