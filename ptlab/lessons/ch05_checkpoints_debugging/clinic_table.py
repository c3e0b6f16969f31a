"""Chapter 5's troubleshooting table: a symptom, its likely causes, the tool that tells them apart, the pitfall."""
from __future__ import annotations

import html
from dataclasses import dataclass

from ptlab.course.pitfalls import get_pitfall


@dataclass(frozen=True)
class ClinicRow:
    """One symptom: what usually causes it, what to check first, and the pitfalls that reproduce it."""

    symptom: str
    causes: str
    check: str
    pitfalls: tuple[str, ...]


CLINIC: tuple[ClinicRow, ...] = (
    ClinicRow("loss is NaN or inf",
              "a learning rate far too high; a NaN or inf in the data; weights initialised at too large a scale "
              "for the depth; log, sqrt or division at 0 in your own code",
              "first_nonfinite(model, X) on the failing batch; torch.isfinite(X).all(); lower the lr 10x; "
              "log the gradient norm that clip_grad_norm_ returns; "
              "torch.autograd.set_detect_anomaly(True) names the backward op that made a NaN",
              ("nan-from-a-poisoned-sample", "nan-from-init-scale", "exploding-gradients-nan")),
    ClinicRow("loss shoots up by orders of magnitude and stays there",
              "a learning rate far too high (the loss can stay finite, with or without BatchNorm: a ruined model "
              "that keeps printing numbers, as chapter 4's learning-rate-too-high shows); with AdamW, "
              "or plain SGD (no momentum), lr times weight decay above 2 multiplies every weight by less than -1 "
              "each step, so the weights flip sign and grow (with SGD's momentum m the bound is 2(1 + m))",
              "lower the lr 10x; lr_range_test; log the loss every few steps, not once per epoch",
              ("learning-rate-too-high",)),
    ClinicRow("loss does not go down",
              "no zero_grad; a graph cut by detach or .item(); layers never registered or frozen; "
              "labels that do not belong to their images; softmax before CrossEntropyLoss; an lr far off",
              "overfit_one_batch(model, batch); diagnose_gradients(model, batch=..., optimizer=...); "
              "look at a batch of images with their labels; lr_range_test",
              ("missing-zero-grad-training", "detach-in-forward", "plain-list-of-layers", "shuffled-labels",
               "softmax-before-cross-entropy")),
    ClinicRow("training accuracy high, validation or test far lower",
              "overfitting: too large a model or too long a run for the data; evaluation in train mode",
              "plot train and validation accuracy per epoch; stop at the best validation epoch; model.eval()",
              ("overfitting-without-regularisation", "eval-without-eval-mode")),
    ClinicRow("validation accuracy jumps between evaluations of the same weights",
              "random augmentation in the evaluation transform; Dropout in train mode; BatchNorm in train mode "
              "with a shuffled evaluation loader (its batch statistics change with the batches)",
              "evaluate the same checkpoint twice: the numbers must be equal (BatchNorm in train mode on a fixed "
              "loader passes this check: also compare with model.eval())",
              ("test-time-augmentation", "eval-without-eval-mode")),
    ClinicRow("a shape error, or a loss that trains to the mean",
              "broadcasting (B, 1) against (B,); a reduction without keepdim; view after a transpose",
              "assert pred.shape == y.shape before the loss; run tests with -W error::UserWarning",
              ("broadcast-loss-shape", "missing-keepdim", "view-after-transpose")),
    ClinicRow("tensors on different devices",
              "the model moved with .to(device) but a batch, or a tensor made inside forward, left on the CPU",
              "move every batch in the loop; pass device= when making tensors in forward",
              ("inputs-on-another-device",)),
    ClinicRow("DataLoader with workers hangs or dies in a notebook",
              "workers started with spawn (macOS, Windows) or forkserver (Linux from Python 3.14) cannot import "
              "a Dataset class defined in the notebook",
              "num_workers=0 to confirm; move the Dataset class to a .py module",
              ("spawn-notebook-dataset",)),
    ClinicRow("an old checkpoint fails to load, or loads nothing",
              "keys prefixed with 'module.' by DDP; layers added or renamed; a new head of another size "
              "(a size mismatch, which strict=False does not forgive); a pickled whole model whose class moved",
              "load with strict=True and read the missing and unexpected keys; for a new head, "
              "load_matching_weights and assert the skipped keys; save state_dicts, not models",
              ("ddp-prefix-strict-false", "batchnorm-added-breaks-strict-load", "new-head-size-mismatch",
               "pickled-whole-model")),
    ClinicRow("out of memory",
              "graphs kept alive (evaluation without no_grad, losses summed as tensors); too large a batch or "
              "image; too large a model. Not DataLoader workers on a GPU: they live in host memory (too many "
              "exhaust the machine's RAM, not the GPU's)",
              "memory_breakdown(model, optimizer, batch); on a GPU torch.cuda.max_memory_allocated and "
              "memory_reserved; then a smaller batch with gradient accumulation, activation checkpointing, "
              "mixed precision (chapter 6)",
              ("eval-without-no-grad", "running-loss-keeps-graph")),
)


class ClinicTable:
    """The troubleshooting table, each pitfall shown with its chapter; HTML in a notebook, text elsewhere."""

    def __init__(self, rows: tuple[ClinicRow, ...]):
        self.rows = rows
        self.chapters = {pid: get_pitfall(pid).chapter for row in rows for pid in row.pitfalls}  # KeyError if gone

    def _links(self, row: ClinicRow) -> str:
        return ", ".join(f"{pid} (ch{self.chapters[pid]})" for pid in row.pitfalls)

    def __repr__(self) -> str:
        return "\n\n".join(f"{r.symptom}\n  causes: {r.causes}\n  check: {r.check}\n  reproduce: {self._links(r)}"
                           for r in self.rows)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{name}</th>"
                       for name in ("symptom", "likely causes", "check first", "pitfalls (chapter)"))
        head = f"<tr>{head}</tr>"
        cell = "<td style='text-align:left;vertical-align:top'>"
        body = "".join(f"<tr>{cell}<b>{html.escape(r.symptom)}</b></td>{cell}{html.escape(r.causes)}</td>"
                       f"{cell}{html.escape(r.check)}</td>{cell}{html.escape(self._links(r))}</td></tr>"
                       for r in self.rows)
        return f"<table style='text-align:left'>{head}{body}</table>"


def clinic_table() -> ClinicTable:
    """The troubleshooting table; raises KeyError if a row names a pitfall that does not exist."""
    return ClinicTable(CLINIC)
