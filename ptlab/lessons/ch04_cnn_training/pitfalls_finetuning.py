"""Chapter 4 pitfalls of fine-tuning: a frozen backbone that still changes, through the optimizer or BatchNorm.

Both start from the backbone shipped in data/ (pretrained on PRETRAIN_CLASSES), give it a new head for
FINETUNE_CLASSES and train on a few labelled images per new class (ptlab/lessons/ch04_cnn_training/finetune.py). What
they measure is
what really moved in the part that was meant to stay fixed.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.lessons.ch04_cnn_training.finetune import (
    few_shot_batches,
    largest_change,
    pretrained_class_accuracy,
    running_stats,
)
from ptlab.reference import FINETUNE_CLASSES, pretrained_backbone


@pitfall(
    id="frozen-backbone-still-updated", chapter=4,
    title="A backbone frozen halfway through training keeps moving: its stale zero gradients still go to the optimizer",
    symptom="after requires_grad_(False), 20 more AdamW steps change all 9 backbone parameter tensors "
            "(the largest change is above 1e-4)",
    why="""requires_grad_(False) stops backward from writing new gradients, but it does not clear .grad. A
    loop that zeroes with optimizer.zero_grad(set_to_none=False) (or code written before torch 2.0 made None
    the default) leaves each frozen parameter a gradient of zeros, not None, and AdamW updates every
    parameter whose .grad is not None: its momentum (exp_avg) from the steps before freezing keeps pushing,
    and weight decay keeps shrinking. With .grad None the optimizer skips the parameter, whatever its
    weight decay: that is why freezing before the first step, or zero_grad() with its default, is safe.""",
    catch="""After freezing, build the optimizer from the parameters that still train
    ([p for p in model.parameters() if p.requires_grad]), or set the frozen parameters' .grad to None.
    Check it: copy the frozen weights before a few steps and compare after (torch.equal).""",
)
def frozen_backbone_still_updated(buggy: bool) -> Outcome:
    torch.manual_seed(0)
    model = pretrained_backbone().train()
    model.head = nn.Linear(model.head.in_features, len(FINETUNE_CLASSES))   # a new head for the new classes
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    batches = few_shot_batches(per_class=20, batch_size=32)
    for step in range(40):
        if step == 20:                                          # 20 steps of full fine-tuning done: freeze
            model.features.requires_grad_(False)
            model.features.eval()                               # BatchNorm statistics stay as they are too
            frozen = [p.detach().clone() for p in model.features.parameters()]
            if buggy:
                pass                                            # BUG: keep the optimizer that holds the backbone
            else:
                optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                              lr=1e-3, weight_decay=0.05)   # FIX: only what still trains
        X, y = next(batches)
        loss = F.cross_entropy(model(X), y)
        optimizer.zero_grad(set_to_none=False)                  # zeros, not None: the frozen grads stay tensors
        loss.backward()
        optimizer.step()
    after = [p.detach() for p in model.features.parameters()]
    changed = sum(not torch.equal(a, b) for a, b in zip(after, frozen))
    return Outcome(
        figures={"backbone parameter tensors": len(frozen), "changed after freezing": changed,
                 "largest change after freezing": largest_change(frozen, after)},
        checks=[Check("backbone parameter tensors changed after freezing (of 9)", changed, "== 9"),
                Check("largest change of a backbone weight after freezing", largest_change(frozen, after), "> 1e-4")],
    )


@pitfall(
    id="frozen-backbone-batchnorm-train-mode", chapter=4,
    title="requires_grad_(False) does not freeze BatchNorm: in train mode its running statistics move to the new data",
    symptom="training only the new head, the frozen backbone's running statistics move by more than 0.1, and the "
            "pretrained model's accuracy on its own classes falls by more than 0.1",
    why="""BatchNorm's running_mean and running_var are buffers, not parameters: no gradient and no optimizer
    touches them. Every forward pass in train mode updates them (momentum 0.1) from the current batch.
    model.train() before the fine-tuning loop puts the frozen backbone in train mode too, so after a few
    dozen batches its statistics describe the new classes' images, not the ones it was trained on. The
    'frozen' backbone is now a different model: shared with the original head (or saved as 'unchanged'),
    it scores far lower on the classes it was pretrained for, and batch statistics of a few images make
    the features noisy while the head trains.""",
    catch="""Freeze with both: backbone.requires_grad_(False) and backbone.eval(), and call backbone.eval()
    again after every model.train(). Compare the BatchNorm buffers before and after a few steps; they
    must be equal. torchvision's detection models use FrozenBatchNorm2d for the same reason.""",
)
def frozen_backbone_batchnorm_train_mode(buggy: bool) -> Outcome:
    torch.manual_seed(0)
    model = pretrained_backbone()
    pretrained_head = model.head                                # kept: the original task still uses it
    before_accuracy = pretrained_class_accuracy(model)
    before_stats = running_stats(model)
    model.features.requires_grad_(False)                        # frozen: no gradients, no optimizer updates
    model.head = nn.Linear(model.head.in_features, len(FINETUNE_CLASSES))
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=3e-3)
    if buggy:
        model.train()                                           # BUG: the frozen backbone's BatchNorm trains too
    else:
        model.train().features.eval()                           # FIX: only the head in train mode
    for _, (X, y) in zip(range(50), few_shot_batches(per_class=10, batch_size=8)):
        loss = F.cross_entropy(model(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    drift = largest_change(before_stats, running_stats(model))
    model.head = pretrained_head                                # the original model, on its own classes
    after_accuracy = pretrained_class_accuracy(model)
    return Outcome(
        figures={"largest change of a running statistic": drift,
                 "accuracy on the pretrained classes, before": before_accuracy,
                 "the same, after training the new head": after_accuracy},
        checks=[Check("largest change of a frozen backbone's running statistic", drift, "> 0.1"),
                Check("accuracy on the pretrained classes, after minus before", after_accuracy - before_accuracy,
                      "< -0.1")],
    )
