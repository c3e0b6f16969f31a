"""Chapter 4 pitfall of the overfit-one-batch ritual: a loss that cannot reach the ritual's target."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.data import normalize_uint8, uint8_split
from ptlab.overfit import label_smoothing_floor, overfit_one_batch


@pitfall(
    id="label-smoothing-overfit-target", chapter=4,
    title="Label smoothing puts a floor under the loss (about 0.50 for 0.1 over 10 classes): an overfit target of 0.05 "
          "can fail on a correct model",
    symptom="with label_smoothing=0.1 over 10 classes, an overfit ritual that cannot see the smoothing (it aims at "
            "0.05, below the loss floor) fails on a correct model, and names too few steps or too small a model as the "
            "likely cause",
    why="""Label smoothing trains against a softened target: `1 - s + s/K` on the true class and `s/K` on each
    of the others (0.91 and 0.01 for `s = 0.1`, `K = 10`). Cross-entropy against a target distribution is
    lowest when the prediction equals it, and that lowest value is the target's entropy, here
    `-0.91 ln 0.91 - 9 × 0.01 ln 0.01 ≈ 0.5003`; a perfect memoriser of the batch stops there. A ritual that
    waits for 0.05 fails on a correct model, and here its diagnosis blames the budget or the model.
    `overfit_one_batch` reads `label_smoothing` from an `nn.CrossEntropyLoss` and aims at the floor plus
    `target_loss`; a functional `F.cross_entropy(..., label_smoothing=...)` inside a lambda hides it.""",
    catch="""Run the ritual with the loss module you train with (`nn.CrossEntropyLoss(label_smoothing=s)`), or
    pass the floor yourself: `overfit_one_batch(..., loss_floor=label_smoothing_floor(K, s))`. Or run the
    ritual without smoothing: it checks the plumbing, not the regularisation. Compare any plateau of a
    smoothed loss with that floor before calling it underfitting.""",
)
def label_smoothing_overfit_target(buggy: bool) -> Outcome:
    images, labels = uint8_split(train=True)
    batch = (normalize_uint8(images[:32]), labels[:32])    # one batch: (32, 3, 32, 32), 10 classes
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 32), nn.ReLU(), nn.Linear(32, 10))
    if buggy:
        loss_fn = lambda logits, y: F.cross_entropy(logits, y, label_smoothing=0.1)  # BUG: the ritual cannot see it
    else:
        loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)  # FIX: the ritual reads label_smoothing
    report = overfit_one_batch(model, batch, loss_fn=loss_fn, steps=60, lr=3e-3, raise_on_failure=False)
    floor = label_smoothing_floor(10, 0.1)                 # the entropy of the smoothed target
    best = torch.tensor([[0.91] + [0.01] * 9]).log()       # logits whose softmax is the smoothed target
    torch_floor = F.cross_entropy(best, torch.tensor([0]), label_smoothing=0.1).item()
    causes = ", ".join(report.causes) or "none: it passed"
    return Outcome(
        figures={"loss floor, from the formula": floor, "torch's loss at the smoothed target": torch_floor,
                 "target the ritual aimed at": report.target_loss, "lowest loss reached": min(report.losses),
                 "ritual passed": report.passed, "likely causes it named": causes},
        checks=[Check("ritual passed", report.passed, "is False"),
                Check("likely causes it named", causes, "contains 'too few steps'")],
        series={"loss": report.losses},
        levels={"loss": {"the target 0.05, blind to the smoothing": 0.05, f"the loss floor, {floor:.2f}": floor}},
    )
