"""Watch a training run, unchanged, and name the course's pitfalls whose signs it saw, with what was measured and where.

    with ptlab.watch.watch(steps=200) as report:
        train()                       # your own loop
    print(report)

or, from a shell: `python -m ptlab watch train.py --lr 0.1 --steps 200 --json findings.json`.

The watch installs global instrumentation for the duration of the block: module forward (pre-)hooks, optimizer
step pre/post hooks, a TorchFunctionMode that sees calls such as F.cross_entropy (taken off the stack inside
optimizer.step()), and thin wrappers around GradScaler, clip_grad_norm_, zero_grad and DataLoader.__iter__. It only
observes: it draws no random numbers, edits no tensor in place, prints no warning the script would not (the loss
size warning still names the learner's line; torch.compile's warning about global hooks counts only the script's
own), and removes every hook and wrapper when the block ends. (While it is on, nn.Transformer layers in eval mode
leave their fused fast path, which global hooks disable, so their outputs can differ in the last bits.)

What a finding means, and the exit status of `python -m ptlab watch`:
- A cause (exit 1) is a sign that correct code rarely shows (none of the correct scripts in tests/watch_corpus/
  shows one): gradients added to over >= 3 steps with no reset between them (a clip or unscale_ writes into .grad
  without resetting it; zero_(), fill_(0), mul_(0), copy_() or an assignment such as `p.grad[:] = 0` resets it),
  zero_grad() between the last backward() and step(), a frozen parameter moved by a step, softmax output (or rows
  that are probabilities) fed to cross_entropy, a (B, 1) against (B,) loss that stretches both sides, training
  batches of one class at a time while several classes appear, a loss that keeps a graph no backward will free
  (retain_graph=True frees nothing), eval-mode outputs with a graph that no backward ever used, BatchNorm or Dropout
  in train mode in passes that no backward used (of the trained model outside its training iterations, or of any
  model in a script that trains nothing), a frozen backbone's BatchNorm in train mode whose statistics moved, NaN in
  an input batch (not an activation another model made) or in the target of a loss that came out non-finite, a
  non-finite loss from finite inputs and targets, a loss that rose >= 30x and stays >= 3x up, and the GradScaler
  mistakes.
- A hint (printed, exit 0) is a sign that correct code can show too: with balanced labels, a training
  cross-entropy still within 5% of ln(classes) after >= 50 cross-entropy calls although the weights moved >= 20% by the
  last watched step (labels that do not belong to their inputs, or a task the model has not learned yet).
- A consequence (printed, not counted) is a loss sign (a rise, a non-finite loss, a loss at chance) that piled-up
  gradients explain, and only where that was measured: the pile's norm had reached 3x its first before the sign
  began. A loss sign that another cause found with it can make too, where nothing measures which one did
  (unshuffled data and a rising loss), is printed as a hint that names that cause.
- Where intent cannot be read from what runs, the watch says nothing: a model no optimizer steps (an EMA or mean
  teacher, a MoCo key encoder, a distillation teacher) may run in train mode under no_grad; so may the trained model
  in passes that recur in most iterations (a GAN's fakes, pseudo-labels), repeat one input (Monte Carlo dropout), or
  follow an explicit eval() of its other layers; a BatchNorm frozen with momentum=0; a broadcast that stretches one
  side only; one class in every batch.
- Gradients, losses and labels are watched over the first `steps` optimizer steps only; a later pass in train mode
  or a kept graph is still seen. A call is placed by the optimizer steps before it ("after optimizer step N", counting
  the unwatched ones too); a loss by the step its backward precedes ("at step N").
Exit 0 means only that none of these signs showed in the steps watched; the report lists what it looked for.
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .report import Report, WatchFinding
from .watcher import EVERY_DETECTOR, Watcher

__all__ = ["watch", "Report", "WatchFinding", "DETECTS", "HINT_ONLY", "main"]

# Which registered pitfall each detector observes, and the sign it looks for: declared once, by the detector (the
# registry test runs every one of them both ways).
DETECTS: dict[str, str] = {sign.pitfall: sign.sign for detector in EVERY_DETECTOR for sign in detector.signs()}
# Of them, those the watch only ever hints at (printed, exit status 0): the catalogue marks them "hint", not ✔.
HINT_ONLY: frozenset[str] = frozenset(sign.pitfall for detector in EVERY_DETECTOR for sign in detector.signs()
                                      if sign.hint)


@contextmanager
def watch(steps: int = 200) -> Iterator[Report]:
    """Observe the block's first `steps` optimizer steps; the yielded Report is filled in when the block ends."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    report = Report()
    watcher = Watcher(steps)
    watcher.install()
    try:
        yield report
    finally:
        watcher.remove()
        report.steps_observed = watcher.step
        report.findings = watcher.findings()
        report.looked_for = list(DETECTS)


def _split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the watch's own options, [SCRIPT, *its args]); --steps/--json are the watch's unless after `--`."""
    own, script = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" and script:
            script += argv[i + 1:]
            break
        if arg in ("--steps", "--json") and i + 1 < len(argv):
            own += argv[i:i + 2]
            i += 2
            continue
        if arg.startswith(("--steps=", "--json=")) or (not script and arg in ("-h", "--help")):
            own.append(arg)
        else:
            script.append(arg)
        i += 1
    return own, script


def main(argv: list[str] | None = None) -> int:
    """`python -m ptlab watch SCRIPT [ARGS...] [--steps N] [--json PATH]`.

    Exit status: 0 no cause found, 1 found, 2 the script failed."""
    own, script = _split_argv(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m ptlab watch", description=__doc__.splitlines()[0],
                                     usage="python -m ptlab watch SCRIPT [SCRIPT_ARGS...] [--steps N] [--json PATH]",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     epilog="--steps and --json are the watch's wherever they stand; a script's own "
                                            "options of those names go after `--`. Exit status: 0 no cause found "
                                            "(hints are still printed), 1 a pitfall found (with any consequences "
                                            "of it), 2 the script failed.")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps to observe")
    parser.add_argument("--json", metavar="PATH", help="also write the findings as JSON to PATH")
    args = parser.parse_args(own)
    if not script:
        parser.error("give the training script to run: python -m ptlab watch SCRIPT [SCRIPT_ARGS...]")
    path = Path(script[0])
    if not path.is_file():
        parser.error(f"SCRIPT {str(path)!r} is not a file")
    report = run_script(path, script[1:], steps=args.steps)
    print(report, file=sys.stderr if report.script_failed else sys.stdout)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n", encoding="utf-8")
    return report.exit_status


def run_script(path: Path, script_args: list[str], steps: int = 200) -> Report:
    """Run a script as __main__ with sys.argv set, under the watch; a failure's traceback is printed."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *script_args]
    sys.path.insert(0, str(path.resolve().parent))
    failed = False
    try:
        with watch(steps=steps) as report:
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as exit_:
                failed = exit_.code not in (None, 0)
            except BaseException:       # the script's own failure: show it, then the report
                failed = True
                traceback.print_exc()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    report.script_failed = failed
    return report
