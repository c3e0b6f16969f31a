"""What chapter 2's checkers compare answers with: the right answers' outputs (and typical
wrong ones') on the checks' fixed inputs. Written by `python tests/answers/test_stored_figures.py`
from the answers in tests/answers, which the handout leaves out; not edited by hand."""

FIGURES = {
    "ch2-clipped-step": {
        "norms before clipping": [70.2354813, 51.0431061, 37.2247391],
        "weights after each step": [
            [-0.0460839421, 0.291570157, -0.386492133, -0.417133629],
            [-0.0776012316, 0.252773851, -0.300413936, -0.407539159],
            [-0.0915579274, 0.193234727, -0.222120911, -0.396115363]
        ]
    },
    "ch2-penalty-in-graph": {
        "penalty": 0.86999929
    },
    "ch2-why-no-training": {
        "layer": "47f0f47134f0f22c"
    }
}
