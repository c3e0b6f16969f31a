"""fit's chapter 5 additions: a checkpoint every epoch, resume in a new process, best on the monitor, early stop."""
import subprocess
import sys
import textwrap

import pytest
import torch

from ptlab.checkpoint import load_checkpoint
from ptlab.train import fit

SETUP = textwrap.dedent('''
    import sys, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from ptlab.train import fit

    def setup():
        g = torch.Generator().manual_seed(0)
        X, y = torch.randn(256, 10, generator=g), torch.randint(0, 3, (256,), generator=g)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        train = DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True,
                           generator=torch.Generator().manual_seed(1))
        val = DataLoader(TensorDataset(X[192:], y[192:]), batch_size=64)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=4 * len(train))
        return model, opt, sched, train, val

    if __name__ == "__main__":
        folder, epochs, resume, out = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume", sys.argv[4]
        model, opt, sched, train, val = setup()
        fit(model, train, val, opt, epochs=epochs, scheduler=sched, scheduler_step="batch", progress=False,
            checkpoint_dir=folder, resume=resume)
        torch.save(model.state_dict(), out)
''')


def test_fit_resumes_in_a_new_process_bit_for_bit(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SETUP)
    sys.path.insert(0, str(tmp_path))
    try:
        import run
    finally:
        sys.path.remove(str(tmp_path))
    model, opt, sched, train, val = run.setup()
    history = fit(model, train, val, opt, epochs=4, scheduler=sched, scheduler_step="batch", progress=False)

    def process(epochs, mode, out):
        subprocess.run([sys.executable, str(script), str(tmp_path / "ckpt"), str(epochs), mode, str(tmp_path / out)],
                       check=True, timeout=300)

    process(2, "fresh", "half.pt")             # a run of 4 epochs, cut after 2
    process(4, "resume", "resumed.pt")         # a new process picks it up from last.pt
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert all(torch.equal(v, resumed[k]) for k, v in model.state_dict().items())
    last = torch.load(tmp_path / "ckpt" / "last.pt", weights_only=True)
    assert last["epoch"] == 4 and last["extra"]["history"]["epoch"] == [1, 2, 3, 4]
    assert last["extra"]["history"]["val_acc"] == pytest.approx(history.val_acc)


def test_best_checkpoint_and_early_stopping(tmp_path):
    sys.path.insert(0, str(tmp_path))
    (tmp_path / "run2.py").write_text(SETUP)
    try:
        import run2
    finally:
        sys.path.remove(str(tmp_path))
    model, opt, _, train, val = run2.setup()
    for group in opt.param_groups:
        group["lr"] = 0.3                      # far too high: the monitored loss soon stops improving
    history = fit(model, train, val, opt, epochs=30, progress=False, checkpoint_dir=tmp_path / "c",
                  monitor="val_loss", early_stopping=2)
    best = min(range(len(history)), key=history.val_loss.__getitem__)
    assert history.best_epoch == history.epoch[best]
    assert history.stopped_early and len(history) == history.best_epoch + 2 < 30
    assert load_checkpoint(tmp_path / "c" / "best.pt", model).epoch == history.best_epoch


def test_bad_settings_are_named(tmp_path):
    model = torch.nn.Linear(2, 2)
    data = [(torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        fit(model, data, data, opt, epochs=1, resume=True, progress=False)
    with pytest.raises(ValueError, match="monitor"):
        fit(model, data, data, opt, epochs=1, monitor="accuracy", progress=False)
    with pytest.raises(ValueError, match="early_stopping"):
        fit(model, data, data, opt, epochs=1, early_stopping=0, progress=False)


def _small_problem(sampler_generator: bool = False):
    from torch import nn
    from torch.utils.data import DataLoader, RandomSampler, TensorDataset

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(128, 6, generator=g), torch.randint(0, 3, (128,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    data = TensorDataset(X[:96], y[:96])
    if sampler_generator:       # the sampler owns its generator; the loader has none
        train = DataLoader(data, batch_size=16, sampler=RandomSampler(data, generator=torch.Generator().manual_seed(3)))
    else:
        train = DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(3))
    return model, train, DataLoader(TensorDataset(X[96:], y[96:]), batch_size=32)


@pytest.mark.parametrize("with_scaler, sampler_generator", [(True, False), (False, True)])
def test_resume_is_exact_with_a_grad_scaler_and_with_a_sampler_that_owns_its_generator(
        tmp_path, with_scaler, sampler_generator):
    def run(epochs, folder, resume):
        model, train, val = _small_problem(sampler_generator)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3) if with_scaler else None
        fit(model, train, val, opt, epochs=epochs, scaler=scaler, progress=False, checkpoint_dir=folder,
            resume=resume)
        return model.state_dict(), scaler

    straight, scaler_straight = run(4, tmp_path / "a", False)
    run(2, tmp_path / "b", False)
    resumed, scaler_resumed = run(4, tmp_path / "b", True)
    assert all(torch.equal(v, resumed[k]) for k, v in straight.items())
    if with_scaler:              # growth every 3 steps: the scale moved, and the resumed run continued from it
        assert scaler_resumed.get_scale() == scaler_straight.get_scale() > 2.0**8


def test_reduce_lr_on_plateau_gets_the_monitored_metric(tmp_path):
    model, train, val = _small_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", patience=0, factor=0.5)
    history = fit(model, train, val, opt, epochs=3, scheduler=plateau, monitor="val_loss", progress=False)
    assert len(history.epoch) == 3           # before: TypeError "step() missing 'metrics'" after the first epoch
    assert plateau.best == min(history.val_loss)
