"""ptlab.watch: every pitfall it claims is caught in the registry's buggy code and absent from the fixed code;
clean training code gives no finding; the watch changes no result and leaves nothing installed; the CLI."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from ptlab.__main__ import main as cli
from ptlab.course.pitfalls import all_pitfalls, get_pitfall
from ptlab.watch import DETECTS, HINT_ONLY, detectors, watch
from ptlab.watch.watcher import EVERY_DETECTOR

BUGGY_SCRIPT = Path(__file__).resolve().parents[2] / "ptlab/lessons/ch05_checkpoints_debugging/buggy_training.py"


def test_every_detected_pitfall_is_registered():
    known = {p.id for p in all_pitfalls()}
    assert set(DETECTS) <= known, sorted(set(DETECTS) - known)
    assert len(DETECTS) >= 15


def test_each_detector_declares_its_pitfall_ids_once():
    """A detector's ids are registered ones; each is typed once in the watch's source, in its detector's Sign."""
    assert set(detectors.Detector.__subclasses__()) == set(EVERY_DETECTOR), "a detector the watch never installs"
    declared = [sign.pitfall for detector in EVERY_DETECTOR for sign in detector.signs()]
    assert all(detector.signs() for detector in EVERY_DETECTOR)
    assert len(declared) == len(set(declared)) and set(declared) == set(DETECTS)
    known = {p.id for p in all_pitfalls()}
    assert set(declared) <= known, sorted(set(declared) - known)
    package = Path(detectors.__file__).parent
    source = "\n".join(path.read_text(encoding="utf-8") for path in sorted(package.glob("*.py")))
    typed = {pid: n for pid in known if (n := len(re.findall(rf"(?<![\w-]){re.escape(pid)}(?![\w-])", source)))}
    assert typed == dict.fromkeys(declared, 1)


IN_RANK = {"ddp-sampler-without-set-epoch"}   # the harness starts rank processes, which the watch cannot see


def _run(record, buggy: bool, tmp_path: Path) -> None:
    """The pitfall's reproduction; for a rank pitfall, what each rank runs, as the one rank of a gloo group."""
    if record.id not in IN_RANK:
        record.run(buggy=buggy)
        return
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store-{buggy}", rank=0, world_size=1)
    try:
        record.reproduce(buggy=buggy, in_rank=True)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("pitfall_id", sorted(DETECTS))
def test_registry_buggy_caught_fixed_clean(pitfall_id, tmp_path):
    record = get_pitfall(pitfall_id)
    with watch() as buggy:
        _run(record, True, tmp_path)
    assert pitfall_id in buggy.pitfalls, str(buggy)
    found = next(f for f in buggy.findings if f.pitfall == pitfall_id)
    assert found.message and found.to_json()["evidence"]["reproduce"] == f"python -m ptlab pitfalls run {pitfall_id}"
    with watch() as fixed:
        _run(record, False, tmp_path)
    assert fixed.findings == [], str(fixed)


def _blobs(n: int = 512, classes: int = 4, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(classes, 8, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, 8, generator=g), y)


def _mlp(batchnorm: bool = True) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(8, 32)] + ([nn.BatchNorm1d(32)] if batchnorm else []) + [nn.ReLU(), nn.Dropout(0.1),
                                                                                nn.Linear(32, 4)]
    return nn.Sequential(*layers)


def _loader(shuffle: bool = True) -> DataLoader:
    return DataLoader(_blobs(), batch_size=32, shuffle=shuffle, generator=torch.Generator().manual_seed(0))


def clean_fit():
    from ptlab.train import fit

    model = _mlp()
    fit(model, _loader(), DataLoader(_blobs(seed=1), batch_size=64), torch.optim.AdamW(model.parameters(), 1e-2),
        epochs=4, progress=False)


def clean_accumulation(k: int = 4):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(4):
        for i, (X, y) in enumerate(_loader()):
            (F.cross_entropy(model(X), y) / k).backward()
            if (i + 1) % k == 0:
                opt.step()
                opt.zero_grad(set_to_none=(epoch % 2 == 0))     # both ways of zeroing, every k batches


def clean_inference_mode_eval():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    kept = []
    for X, y in _loader():
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.inference_mode():
        for X, y in _loader(shuffle=False):
            kept.append(model(X))                               # kept, but no graph
    total = 0.0
    with torch.no_grad():
        for X, y in _loader(shuffle=False):
            total += F.cross_entropy(model(X), y)               # a tensor, but without a grad_fn


def clean_frozen_batchnorm():
    model = _mlp()
    model[1].eval()                                             # BatchNorm frozen on purpose, parameters too
    model[1].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], 1e-2)
    for X, y in _loader():
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def clean_bf16_without_scaler():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), 1e-2)
    for X, y in _loader():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def clean_label_smoothing():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), 1e-2)
    for _ in range(5):                                          # 80 steps: enough for the loss-at-chance check
        for X, y in _loader():
            loss = nn.CrossEntropyLoss(label_smoothing=0.1)(model(X), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


def clean_fp16_with_scaler_and_clipping():
    model = _mlp(batchnorm=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    for X, y in _loader():
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()


CLEAN = [clean_fit, clean_accumulation, clean_inference_mode_eval, clean_frozen_batchnorm,
         clean_bf16_without_scaler, clean_label_smoothing, clean_fp16_with_scaler_and_clipping]


@pytest.mark.parametrize("code", CLEAN, ids=lambda f: f.__name__)
def test_clean_training_code_gives_no_finding(code):
    with watch() as report:
        code()
    assert report.steps_observed > 0
    assert report.findings == [], str(report)


def test_clean_reference_script(tmp_path):
    from ptlab.train_script import main as train_main

    with watch() as report:
        train_main(["--dry-run", "--epochs", "1", "--width", "8", "--checkpoint-dir", str(tmp_path / "ckpt"),
                    "--runs-dir", str(tmp_path / "runs")])
    assert report.steps_observed > 0
    assert report.findings == [], str(report)


def test_detector_can_fail_accumulation_without_zeroing():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch() as report:
        for i, (X, y) in enumerate(_loader()):
            F.cross_entropy(model(X), y).backward()
            opt.step()
            if i == 100:                                        # never: zeroing was forgotten
                opt.zero_grad()
    assert report.pitfalls == ["missing-zero-grad-training"]   # one finding for one bug (16 steps: the loop's id)
    assert report.exit_status == 1


def _train_steps(steps: int = 12) -> list[torch.Tensor]:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), 1e-2)
    for _, (X, y) in zip(range(steps), _loader()):
        loss = F.cross_entropy(model(X).softmax(1), y)          # with a bug, so the detectors do work
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        model(next(iter(_loader()))[0])                         # and a train-mode no-grad pass
    return [p.detach().clone() for p in model.parameters()] + [b.clone() for b in model.buffers()]


def test_weights_identical_with_and_without_the_watch():
    torch.manual_seed(1)
    plain = _train_steps()
    rng_plain = torch.rand(3)
    torch.manual_seed(1)
    with watch() as report:
        watched = _train_steps()
    rng_watched = torch.rand(3)
    assert report.findings                                      # the watch did observe something
    assert all(torch.equal(a, b) for a, b in zip(plain, watched))
    assert torch.equal(rng_plain, rng_watched)                  # no extra random draws


def _installed() -> dict[str, object]:
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o
    from torch.overrides import _get_current_function_mode_stack

    return {"forward hooks": len(m._global_forward_hooks), "forward pre hooks": len(m._global_forward_pre_hooks),
            "step pre hooks": len(o._global_optimizer_pre_hooks),
            "step post hooks": len(o._global_optimizer_post_hooks),
            "modes": len(_get_current_function_mode_stack()),
            "patched": [torch.amp.GradScaler.scale, torch.amp.GradScaler.step, torch.amp.GradScaler.update,
                        torch.amp.GradScaler.unscale_, nn.utils.clip_grad_norm_, DataLoader.__iter__,
                        torch.optim.Optimizer.zero_grad, nn.Module.zero_grad, m._has_any_global_hook]}


def test_no_hook_left_installed_even_after_an_error():
    before = _installed()
    with watch():
        assert _installed() != before                           # it did install something
    assert _installed() == before
    with pytest.raises(ZeroDivisionError):
        with watch():
            1 / 0
    assert _installed() == before


def test_steps_limit():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(steps=5) as report:
        for X, y in _loader():
            F.cross_entropy(model(X), y).backward()
            opt.step()
    assert report.steps_observed == 5
    with pytest.raises(ValueError, match="steps"):
        with watch(steps=0):
            pass


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


TRAIN = """
    import sys
    import torch
    from torch import nn
    torch.manual_seed(0)
    X, y = torch.randn(64, 3), torch.randn(64)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = int(sys.argv[sys.argv.index("--epochs") + 1]) if "--epochs" in sys.argv else 5
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(X){fix}, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    {tail}
"""


def test_cli_exit_0_when_clean(tmp_path, capsys):
    script = _script(tmp_path, TRAIN.format(fix=".squeeze(1)", tail="print('done', steps)"))
    out = tmp_path / "w.json"
    assert cli(["watch", str(script), "--epochs", "7", "--json", str(out)]) == 0
    assert "done 7" in capsys.readouterr().out                  # the script's own argument reached it
    assert json.loads(out.read_text()) == {"findings": [], "steps_observed": 7, "looked_for": list(DETECTS)}


@pytest.mark.filterwarnings("ignore:Using a target size")  # the script's own bug warns
def test_cli_exit_1_and_json_when_found(tmp_path, capsys):
    script = _script(tmp_path, TRAIN.format(fix="", tail="pass"))
    out = tmp_path / "w.json"
    assert cli(["watch", "--steps", "3", str(script), "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["steps_observed"] == 3
    assert [f["pitfall"] for f in data["findings"]] == ["broadcast-loss-shape"]
    finding = data["findings"][0]
    assert set(finding) == {"pitfall", "kind", "message", "evidence"} and finding["kind"] == "cause"
    assert finding["evidence"]["where"].endswith("train.py:11")
    assert "python -m ptlab pitfalls run broadcast-loss-shape" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:Using a target size")  # the script's own bug warns
def test_cli_exit_2_when_the_script_fails(tmp_path, capsys):
    script = _script(tmp_path, TRAIN.format(fix="", tail="raise RuntimeError('boom in the script')"))
    assert cli(["watch", str(script)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "boom in the script" in err
    assert "broadcast-loss-shape" in err                        # the report still comes, after the traceback
    script = _script(tmp_path, TRAIN.format(fix=".squeeze(1)", tail="sys.exit(3)"))
    assert cli(["watch", str(script)]) == 2
    script = _script(tmp_path, TRAIN.format(fix=".squeeze(1)", tail="sys.exit(0)"))
    assert cli(["watch", str(script)]) == 0


def test_buggy_training_script_shows_exactly_its_three_bugs(capsys):
    out = capsys
    assert cli(["watch", str(BUGGY_SCRIPT), "--steps", "30"]) == 1
    text = out.readouterr().out
    found = [line.split(":")[0][2:] for line in text.splitlines() if line.startswith("- ")]
    assert sorted(found) == ["eval-without-eval-mode", "running-loss-keeps-graph", "softmax-before-cross-entropy"]
    bug_lines = [i + 1 for i, line in enumerate(BUGGY_SCRIPT.read_text().splitlines()) if "# BUG:" in line]
    for line in bug_lines:
        assert f"buggy_training.py:{line}" in text, (line, text)


def test_no_false_alarm_from_a_saliency_map_or_a_loss_module():
    model = _mlp().eval()                                       # eval mode with gradients: a saliency map
    X, y = next(iter(_loader()))
    with watch() as report:
        for _ in range(3):
            X = X.clone().requires_grad_(True)
            nn.CrossEntropyLoss()(model(X), y).backward()       # a loss module called on its own
    assert report.findings == [], str(report)


def test_a_loss_warning_names_the_same_line_with_and_without_the_watch():
    import warnings

    X, y = torch.randn(8, 1), torch.randn(8)

    def run():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for _ in range(5):
                F.mse_loss(X, y)                                # (8, 1) vs (8,): torch warns, once per line
                nn.MSELoss()(X, y)
        return [(w.filename, w.lineno, str(w.message)) for w in caught]

    plain = run()
    with watch() as report:
        watched = run()
    assert len(plain) == 2 and watched == plain
    assert report.pitfalls == ["broadcast-loss-shape"]


def test_the_catalogue_marks_exactly_the_detected_pitfalls():
    from ptlab.course.catalogue import catalogue_markdown

    rows = catalogue_markdown().splitlines()
    assert rows[0].split("|")[4].strip() == "Watch"
    def marked(mark: str) -> set[str]:
        return {row.rsplit("|", 2)[-2].strip().split()[-1].rstrip("`") for row in rows[2:]
                if row.split("|")[4].strip() == mark}

    assert marked("✔") == set(DETECTS) - HINT_ONLY and marked("hint") == HINT_ONLY == {"shuffled-labels"}


# Correct code that an independent review found reported as a pitfall, each case now a test that must stay quiet:
# a summed micro-batch loss with one backward, a recurrent cell unrolled in time, one GradScaler stepping two
# optimizers, a float16-autocast validation pass in fp32 training, a peek at one batch of a DistributedSampler
# before a loop that calls set_epoch, and reentrant activation checkpointing over a BatchNorm.
CASES = Path(__file__).with_name("watch_cases")


@pytest.mark.parametrize("script, args", [("c1_accum_sum.py", []), ("c3_seq.py", []), ("c4_two_opt_scaler.py", []),
                                          ("c5_fp16_eval.py", []), ("c6_ddp_peek.py", []),
                                          ("c9_ckpt.py", ["reentrant"]), ("c9_ckpt.py", ["plain"])])
def test_correct_code_a_review_found_flagged_now_gives_no_finding(script, args, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(CASES))
    status = cli(["watch", str(CASES / script), *args])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "no pitfall found" in out


def test_a_notebook_cell_is_named_as_such_not_by_its_temporary_file():
    """A finding in a Jupyter cell points at the cell, never at the kernel's temporary file (a path of the machine)."""
    from ptlab.watch.report import _shown_place

    assert _shown_place("/tmp/ipykernel_23420/4157901024.py:13") == "this notebook cell, line 13"
    assert _shown_place("train.py:12") == "train.py:12"
