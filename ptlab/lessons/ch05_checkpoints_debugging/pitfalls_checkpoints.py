"""Chapter 5 pitfalls: saving, loading and resuming, and runs that cannot be repeated.

The reproductions train a small MLP on three Gaussian blobs (600 points, 2 features, blobs.py): it
learns in a fraction of a second, so each pitfall runs in about a second on a laptop CPU. The blobs
and the MLP are shared with the debugging pitfalls (pitfalls_debugging.py).
"""
from __future__ import annotations

import functools
import io
import re
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from ptlab.checkpoint import load_checkpoint, load_matching_weights, save_checkpoint
from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.lessons.ch05_checkpoints_debugging.blobs import blob_mlp, blobs


def _accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(X).argmax(1) == y).float().mean().item()


@functools.lru_cache(maxsize=1)
def _trained_state(steps: int = 100) -> dict[str, torch.Tensor]:
    """The weights of the MLP trained on the blobs, once per process (callers get copies)."""
    torch.manual_seed(0)
    model, (X, y) = blob_mlp(), blobs()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def _trained_mlp() -> nn.Sequential:
    """A fresh copy of the trained MLP."""
    model = blob_mlp()
    model.load_state_dict(_trained_state())
    return model


@pitfall(
    id="ddp-prefix-strict-false", chapter=5,
    title="strict=False on a checkpoint saved from a DDP-wrapped model loads nothing, silently",
    symptom="0 of the 6 parameter tensors are loaded, no error is raised, and accuracy stays below 0.5 "
            "(chance is 0.33)",
    why="""DistributedDataParallel keeps your model as its attribute `module`, so model.state_dict() of the
    wrapper names every key 'module.0.weight' instead of '0.weight'. load_state_dict(strict=False) skips
    every key it does not know and every key it misses, and reports them only in its return value: the
    model keeps its random initial weights while the code carries on as if it had loaded.""",
    catch="""Keep strict=True (the default): it raises one RuntimeError that lists every missing and every
    unexpected key. Save `model.module.state_dict()` from the wrapper (ptlab.checkpoint.save_checkpoint
    does), or strip the prefix with
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, 'module.').
    If you must use strict=False, assert that its missing_keys and unexpected_keys are what you expect.""",
)
def ddp_prefix_strict_false(buggy: bool) -> Outcome:
    X, y = blobs(seed=1)                                      # held-out points
    trained = _trained_mlp().state_dict()
    saved = {f"module.{k}": v for k, v in trained.items()}    # as a DDP wrapper saves it
    torch.manual_seed(1)
    fresh = blob_mlp()
    if buggy:
        result = fresh.load_state_dict(saved, strict=False)   # BUG: every key is unexpected; nothing loads
    else:
        nn.modules.utils.consume_prefix_in_state_dict_if_present(saved, "module.")   # FIX: plain keys
        result = fresh.load_state_dict(saved)                  # FIX: strict=True would raise on a mismatch
    # A tensor counts as loaded when it holds the trained values, whatever its key was called.
    loaded = sum(torch.equal(p, trained[k]) for k, p in fresh.state_dict().items())
    accuracy = _accuracy(fresh, X, y)
    return Outcome(
        figures={"missing keys": len(result.missing_keys), "unexpected keys": len(result.unexpected_keys),
                 "tensors holding the trained values": loaded, "accuracy on held-out points": accuracy},
        checks=[Check("tensors holding the trained values", loaded, "== 0"),
                Check("accuracy on held-out points", accuracy, "< 0.5")],
    )


def _with_batchnorm() -> nn.Sequential:
    return nn.Sequential(nn.Linear(2, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 3))


@pitfall(
    id="batchnorm-added-breaks-strict-load", chapter=5,
    title="A BatchNorm inserted into a model makes its old checkpoint fail to load",
    symptom="load_state_dict raises RuntimeError naming the missing running_mean and running_var keys, "
            "and the old weights of the later layers sit under keys the new model does not have",
    why="""A state_dict is keyed by each module's position and name. BatchNorm brings parameters (weight,
    bias) and buffers (running_mean, running_var, num_batches_tracked) the old checkpoint does not have,
    and inserting it into an nn.Sequential shifts the index of every later layer ('2.weight' becomes
    '3.weight'), so those layers' old weights no longer match any key. Dropout has no parameters and no
    buffers: appended at the end it changes no key, inserted in the middle it still shifts the indices.""",
    catch="""Name submodules (an nn.Module with attributes, or nn.Sequential(OrderedDict(...))) so that
    inserting a layer does not rename the others. To reuse old weights in a changed model, map each old
    key to its new name, load with strict=False, and assert that missing_keys holds exactly the new
    layer's keys and unexpected_keys is empty; keep a checkpoint's architecture version in its config.""",
)
def batchnorm_added_breaks_strict_load(buggy: bool) -> Outcome:
    old_state = _trained_mlp().state_dict()                     # keys 0.*, 2.*, 4.* (the three Linears)
    model = _with_batchnorm()                                   # a BatchNorm at index 1: Linears now 0, 3, 5
    if buggy:
        state, strict = old_state, True                         # BUG: the old keys, loaded as they are
    else:
        new_index = {"0": "0", "2": "3", "4": "5"}              # FIX: each old Linear's new position
        state = {new_index[k.split(".")[0]] + k[1:]: v for k, v in old_state.items()}
        strict = False                                          # FIX: the BatchNorm's keys are allowed to miss
    try:
        result = model.load_state_dict(state, strict=strict)
        error = "no error"
        assert all(k.startswith("1.") for k in result.missing_keys)   # FIX: only the new layer's keys miss
        assert not result.unexpected_keys                       # FIX: and no old tensor is left over
    except RuntimeError as err:
        missing = next(line for line in str(err).splitlines() if "Missing key" in line)
        error = "RuntimeError, missing " + ", ".join(re.findall(r'"([^"]+)"', missing))
    homeless = set(state) - set(model.state_dict())             # old tensors under keys the model lacks
    return Outcome(
        figures={"keys in the old checkpoint": len(old_state), "keys the new model expects": len(model.state_dict()),
                 "old tensors without a matching key": len(homeless)},
        checks=[Check("load_state_dict error", error, "contains 'running_mean'"),
                Check("old tensors without a matching key", len(homeless), "> 0")],
    )


def _classifier(n_classes: int) -> nn.Sequential:
    """The blob MLP's body (2 -> 64 -> 64, ReLU) and a named head: keys body.0/body.2 and head."""
    body = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    return nn.Sequential(OrderedDict(body=body, head=nn.Linear(64, n_classes)))


@pitfall(
    id="new-head-size-mismatch", chapter=5,
    title="A checkpoint with a 10-class head does not load into a 3-class model, even with strict=False",
    symptom="load_state_dict(strict=False) raises RuntimeError: size mismatch for head.weight",
    why="""strict=False forgives keys that are missing or unexpected, never a key whose tensor has another
    shape: a size mismatch raises with strict=True and strict=False alike. Reusing a body trained on
    another task with a new head is the usual case: the head's keys are the same, its shape is not.
    The error comes after torch has copied every tensor it could, so a model caught in a try/except
    is half loaded: the body holds the checkpoint's weights, the head its own.""",
    catch="""Load the tensors whose name and shape both match (ptlab.checkpoint.load_matching_weights, or a
    dict comprehension over model.state_dict()), then assert exactly which keys were skipped: the
    head's, and nothing else. A skipped body key means the checkpoint is not the model you think.""",
)
def new_head_size_mismatch(buggy: bool) -> Outcome:
    torch.manual_seed(0)
    checkpoint = _classifier(n_classes=10).state_dict()        # stands in for a checkpoint of a 10-class task
    torch.manual_seed(1)
    model = _classifier(n_classes=3)                            # the same body, a new 3-class head
    loaded, skipped = "-", "-"
    try:
        if buggy:
            model.load_state_dict(checkpoint, strict=False)     # BUG: strict=False does not forgive a wrong shape
        else:
            result = load_matching_weights(model, checkpoint)   # FIX: only keys whose name and shape match
            assert result.skipped == ["head.weight", "head.bias"]   # FIX: and only the head is left out
            loaded, skipped = len(result.loaded), ", ".join(result.skipped)
        error = "no error"
    except RuntimeError as err:
        error = str(err).splitlines()[1].strip()                # the first 'size mismatch for ...' line
    body = [k for k in checkpoint if k.startswith("body.")]
    same = sum(torch.equal(model.state_dict()[k], checkpoint[k]) for k in body)
    return Outcome(
        figures={"tensors loaded": loaded, "keys skipped": skipped,
                 "body tensors equal to the checkpoint's": f"{same} of {len(body)}"},
        checks=[Check("load_state_dict error", error, "contains 'size mismatch for head.weight'")],
    )


def _train(model: nn.Module, opt, sched, X, y, g: torch.Generator, steps: int, losses: list, lrs: list) -> None:
    for _ in range(steps):
        idx = torch.randint(0, len(y), (32,), generator=g)
        loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        lrs.append(opt.param_groups[0]["lr"])


def _recipe(model: nn.Module, steps: int):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=steps)


@pitfall(
    id="model-only-checkpoint", chapter=5,
    title="A checkpoint of the model alone restarts the optimizer and the learning-rate schedule on resume",
    symptom="after a resume at step 60 of 120, the final learning rate is over 10x what the schedule "
            "gives, and the weights differ from an uninterrupted run",
    why="""The optimizer's state is part of training: Adam's running moments (SGD's momentum) and the
    scheduler's position in its schedule. Resumed from model weights alone, a fresh optimizer starts
    its moments from zero and a fresh OneCycleLR starts its warm-up again: the second half trains
    with a learning rate the schedule had long annealed, and the run is no longer the one you
    planned, or the one you could repeat.""",
    catch="""Save optimizer.state_dict(), scheduler.state_dict(), the epoch and the random states with the
    model (ptlab.checkpoint.save_checkpoint), and test resuming: 2 + 2 epochs must give the same weights
    as 4 straight. Log the learning rate every epoch: a jump at a resume is this bug.""",
)
def model_only_checkpoint(buggy: bool) -> Outcome:
    X, y = blobs()
    torch.manual_seed(0)
    straight, losses_straight, lrs_straight = blob_mlp(), [], []
    _train(straight, *_recipe(straight, 120), X, y, torch.Generator().manual_seed(1), 120, losses_straight,
           lrs_straight)
    torch.manual_seed(0)
    model, losses, lrs = blob_mlp(), [], []
    opt, sched = _recipe(model, 120)
    g = torch.Generator().manual_seed(1)
    _train(model, opt, sched, X, y, g, 60, losses, lrs)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "step60.pt"
        if buggy:
            torch.save(model.state_dict(), path)               # BUG: the optimizer and schedule are not saved
        else:
            save_checkpoint(path, model, opt, sched, epoch=60, generators={"batches": g})   # FIX: all state
        torch.manual_seed(99)                                  # resume as a new process would: new objects
        model = blob_mlp()
        opt, sched = _recipe(model, 120)                       # fresh moments, a schedule at its start
        if buggy:
            model.load_state_dict(torch.load(path))            # BUG: only the weights come back
        else:                                                  # (the buggy run keeps its batch generator g)
            g = torch.Generator().manual_seed(99)
            load_checkpoint(path, model, opt, sched, generators={"batches": g})   # FIX: every state comes back
    _train(model, opt, sched, X, y, g, 60, losses, lrs)
    lr_ratio = lrs[-1] / lrs_straight[-1]
    drift = max((a - b).abs().max().item() for a, b in zip(model.parameters(), straight.parameters()))
    return Outcome(
        figures={"final learning rate, resumed / uninterrupted": lr_ratio,
                 "largest weight difference from the uninterrupted run": drift,
                 "training loss, last 10 steps": sum(losses[-10:]) / 10,
                 "same, uninterrupted": sum(losses_straight[-10:]) / 10},
        checks=[Check("final learning rate, resumed / uninterrupted", lr_ratio, "> 10"),
                Check("largest weight difference from the uninterrupted run", drift, "> 0")],
        series={"learning rate": lrs, "training loss": losses},
    )


@pitfall(
    id="unseeded-runs-differ", chapter=5,
    title="Without a seed, two runs of the same code train different models",
    symptom="two runs of the same script end with different weights and a different final training loss",
    why="""Initial weights, shuffling, dropout and augmentation all draw from random generators. Unseeded,
    torch seeds its generator from the clock and the OS at start-up, so every run starts elsewhere and
    ends elsewhere: a change you make cannot be told from the noise of a new seed.""",
    catch="""Seed every generator once, at the top (ptlab.seed_everything(seed): Python, NumPy, torch on
    every device), give each DataLoader its own seeded generator, and log the seed with the run. To
    measure a change, compare several seeds per setting, not one run each.""",
)
def unseeded_runs_differ(buggy: bool) -> Outcome:
    X, y = blobs()
    results = []
    for _ in range(2):                                         # the same code, run twice
        if buggy:
            torch.seed()                                       # BUG: a fresh, non-deterministic seed per run
        else:
            torch.manual_seed(0)                               # FIX: the same seed for every run
        model = blob_mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(30):
            loss = nn.functional.cross_entropy(model(X), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        results.append((nn.utils.parameters_to_vector(model.parameters()).detach(), loss.item()))
    (w1, loss1), (w2, loss2) = results
    difference = (w1 - w2).abs().max().item()
    return Outcome(
        figures={"final loss, run 1": loss1, "final loss, run 2": loss2, "largest weight difference": difference},
        checks=[Check("largest weight difference between the runs", difference, "> 0"),
                Check("final losses equal", loss1 == loss2, "is False")],
    )


class OldNet(nn.Module):
    """A model class that a later version of a project moves or renames (the pitfall below)."""

    def __init__(self):
        super().__init__()
        self.body = blob_mlp()

    def forward(self, x):
        return self.body(x)


@pitfall(
    id="pickled-whole-model", chapter=5,
    title="torch.save(model) pickles a reference to the class: the file breaks when the class moves",
    symptom="after the class moves, loading raises AttributeError naming it; with weights_only=True "
            "(the default) it is refused as an unsupported global",
    why="""torch.save(model) pickles the module object: the tensors plus the import path of its class
    (ptlab.lessons.ch05_checkpoints_debugging.pitfalls_checkpoints.OldNet). Loading imports that path again, so
    renaming the class,
    moving the file or changing the package breaks every old checkpoint. Since torch 2.6,
    torch.load also defaults to weights_only=True, which refuses any class it was not told to trust:
    unpickling arbitrary classes can run arbitrary code.""",
    catch="""Save model.state_dict() (and the config that rebuilds the model), then build the model in
    code and load_state_dict into it. Never answer the weights_only error with weights_only=False for
    a file you did not make; allowlist your own plain classes with torch.serialization.add_safe_globals.""",
)
def pickled_whole_model(buggy: bool) -> Outcome:
    here = sys.modules[OldNet.__module__]                       # the module that defines the class
    buffer = io.BytesIO()
    if buggy:
        torch.save(OldNet(), buffer)                            # BUG: pickles the class's import path
    else:
        torch.save(OldNet().state_dict(), buffer)               # FIX: tensors and their names only
    errors = {}
    moved = here.OldNet
    del here.OldNet                                             # the class moves in a later version
    try:
        for weights_only in (True, False):                      # False only on a file we made ourselves
            buffer.seek(0)
            try:
                torch.load(buffer, weights_only=weights_only)
                errors[weights_only] = "loads"
            except Exception as err:                            # what the learner would see
                errors[weights_only] = _key_sentence(err)
    finally:
        here.OldNet = moved
    return Outcome(
        figures={"weights_only=True": errors[True], "weights_only=False": errors[False]},
        checks=[Check("weights_only=True", errors[True], "contains 'Unsupported global'"),
                Check("weights_only=False", errors[False], "contains \"AttributeError: Can't get attribute\"")],
    )


def _key_sentence(err: Exception) -> str:
    """The sentence of a load error that names the cause, without the file path of this machine."""
    text = str(err)
    if "Unsupported global" in text:
        start = text.index("Unsupported global")
        return text[start:text.index("by default", start) + len("by default")]
    return f"{type(err).__name__}: {text.split(' from ')[0]}>"
