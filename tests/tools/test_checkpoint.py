"""ptlab.checkpoint: atomic writes, exact resume across processes, weights_only loading."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from ptlab.checkpoint import (atomic_save, load_checkpoint, load_matching_weights, random_state, save_checkpoint,
                              set_random_state)

ROOT = Path(__file__).resolve().parents[2]

# A training run that uses every kind of state a resume must restore: shuffled batches from a
# DataLoader generator, dropout from the global RNG, AdamW moments and a OneCycleLR schedule.
TRAINING = textwrap.dedent('''
    import sys, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from ptlab.checkpoint import load_checkpoint, save_checkpoint

    def setup():
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        X, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
        loader_gen = torch.Generator().manual_seed(2)
        loader = DataLoader(TensorDataset(X, y), batch_size=16, shuffle=True, generator=loader_gen)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=4 * len(loader))
        return model, opt, sched, loader, loader_gen

    def train(model, opt, sched, loader, epochs):
        for _ in range(epochs):
            for X, y in loader:
                loss = nn.functional.cross_entropy(model(X), y)
                opt.zero_grad(); loss.backward(); opt.step(); sched.step()

    if __name__ == "__main__":
        mode, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
        model, opt, sched, loader, loader_gen = setup()
        if mode == "first-half":
            train(model, opt, sched, loader, 2)
            save_checkpoint(path, model, opt, sched, epoch=2, generators={"train_loader": loader_gen})
        else:
            start = load_checkpoint(path, model, opt, sched, generators={"train_loader": loader_gen}).epoch
            train(model, opt, sched, loader, 4 - start)
        torch.save(model.state_dict(), out)
''')


def test_resume_in_another_process_reproduces_uninterrupted_training_bit_for_bit(tmp_path):
    script = tmp_path / "training.py"
    script.write_text(TRAINING)
    sys.path.insert(0, str(tmp_path))
    try:
        import training
    finally:
        sys.path.remove(str(tmp_path))
    model, opt, sched, loader, _ = training.setup()
    training.train(model, opt, sched, loader, 4)
    straight = model.state_dict()

    def run(*args):
        subprocess.run([sys.executable, str(script), *args], check=True, cwd=ROOT, timeout=300)

    ckpt = tmp_path / "epoch2.pt"
    run("first-half", str(ckpt), str(tmp_path / "half.pt"))
    run("second-half", str(ckpt), str(tmp_path / "resumed.pt"))
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    half = torch.load(tmp_path / "half.pt", weights_only=True)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight), "2 + 2 epochs differ from 4 straight"
    assert not all(torch.equal(straight[k], half[k]) for k in straight), "the second half trained nothing"


def test_a_checkpoint_without_the_loader_generator_does_not_resume_exactly(tmp_path):
    """The control: leave one piece of state out and the weights differ, so the test above can fail."""
    script = tmp_path / "training.py"
    script.write_text(TRAINING.replace('generators={"train_loader": loader_gen}).epoch', ').epoch'))
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        import training
        importlib.reload(training)
    finally:
        sys.path.remove(str(tmp_path))
    model, opt, sched, loader, _ = training.setup()
    training.train(model, opt, sched, loader, 4)
    for mode, out in (("first-half", "half.pt"), ("second-half", "resumed.pt")):
        subprocess.run([sys.executable, str(script), mode, str(tmp_path / "c.pt"), str(tmp_path / out)],
                       check=True, cwd=ROOT, timeout=300)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert not all(torch.equal(v, resumed[k]) for k, v in model.state_dict().items())


def test_a_writer_killed_mid_save_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "last.pt"
    writer = textwrap.dedent(f'''
        import torch
        from ptlab.checkpoint import atomic_save
        atomic_save({{"epoch": 1, "w": torch.ones(3)}}, {str(path)!r})
        print("first saved", flush=True)
        atomic_save({{"epoch": 2, "w": torch.zeros(3), '''
        f'''"big": torch.zeros(400_000_000, dtype=torch.uint8)}}, {str(path)!r})
    ''')
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "first saved"
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size > 1_000_000 for p in tmp_path.glob(".last.pt.*.tmp")):
        assert time.monotonic() < deadline and proc.poll() is None, "the second save never started writing"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    state = torch.load(path, weights_only=True)
    assert state["epoch"] == 1 and torch.equal(state["w"], torch.ones(3))


def test_random_state_round_trips_through_weights_only_loading(tmp_path):
    import random

    import numpy as np

    atomic_save(random_state(), tmp_path / "rng.pt")
    first = (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random())
    set_random_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()) == first


def test_loading_names_what_is_wrong(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt", model)
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="not a ptlab checkpoint"):
        load_checkpoint(tmp_path / "bare.pt", model)
    save_checkpoint(tmp_path / "model-only.pt", model, epoch=0)
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(tmp_path / "model-only.pt", model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="epoch"):
        save_checkpoint(tmp_path / "x.pt", model, epoch=-1)
    with pytest.raises(RuntimeError, match="Missing key"):
        load_checkpoint(tmp_path / "model-only.pt", nn.Sequential(nn.Linear(2, 2)))


def test_a_wrapped_model_saves_and_loads_the_plain_keys(tmp_path):
    """DataParallel stands in for DDP (same .module wrapper; DDP needs a process group, see test_distributed)."""
    torch.manual_seed(0)
    source, target = nn.Linear(3, 2), nn.Linear(3, 2)
    save_checkpoint(tmp_path / "wrapped.pt", nn.DataParallel(source), epoch=1)
    saved = torch.load(tmp_path / "wrapped.pt", weights_only=True)["model"]
    assert sorted(saved) == ["bias", "weight"]  # no 'module.' prefix
    load_checkpoint(tmp_path / "wrapped.pt", nn.DataParallel(target), restore_random=False)
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
    load_checkpoint(tmp_path / "wrapped.pt", nn.Linear(3, 2), restore_random=False)  # and into a plain model


def test_the_next_save_removes_the_temporary_file_a_killed_writer_left(tmp_path):
    path = tmp_path / "last.pt"
    atomic_save({"epoch": 1}, path)
    atomic_save({"epoch": 1}, tmp_path / "best.pt")
    killed = textwrap.dedent(f'''
        import os, signal, torch
        def save_then_die(obj, handle):  # the kill lands halfway through torch.save
            handle.write(b"half a checkpoint"); handle.flush(); os.kill(os.getpid(), signal.SIGKILL)
        torch.save = save_then_die
        from ptlab.checkpoint import atomic_save
        atomic_save({{"epoch": 2}}, {str(path)!r})
    ''')
    assert subprocess.run([sys.executable, "-c", killed], cwd=ROOT, timeout=60).returncode == -signal.SIGKILL
    (stale,) = tmp_path.glob(".last.pt.*.tmp")
    dead = stale.name.split(".")[3]
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a writer still at work
    try:
        others = [tmp_path / f".last.pt.{live.pid}.tmp", tmp_path / f".best.pt.{dead}.tmp",  # another target's
                  tmp_path / f".last.pt.{dead}.tmp.bak", tmp_path / ".last.pt.x.tmp"]
        for other in others:
            other.write_bytes(b"not ours to remove")
        atomic_save({"epoch": 3}, path)
    finally:
        live.kill()
        live.wait()
    assert not stale.exists(), "the killed writer's temporary file outlived the next save"
    assert all(other.exists() for other in others), "only a dead writer's temporary file of this target goes"
    assert torch.load(path, weights_only=True) == {"epoch": 3}
    assert torch.load(tmp_path / "best.pt", weights_only=True) == {"epoch": 1}


def _net(n_out: int, hidden: int = 8) -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


def test_load_matching_weights_loads_the_body_and_skips_a_head_of_another_shape():
    torch.manual_seed(0)
    source = _net(10)
    torch.manual_seed(1)
    target = _net(3)
    head_before = target[2].weight.clone()
    with pytest.raises(RuntimeError, match="size mismatch for 2.weight"):
        _net(3).load_state_dict(source.state_dict(), strict=False)   # what the helper exists to avoid
    result = load_matching_weights(target, source.state_dict())
    assert result.loaded == ["0.weight", "0.bias"]
    assert result.skipped == ["2.weight", "2.bias"]
    assert result.missing == ["2.weight", "2.bias"]            # the model's own head keeps its values
    assert torch.equal(target[0].weight, source[0].weight) and torch.equal(target[0].bias, source[0].bias)
    assert torch.equal(target[2].weight, head_before)


def test_load_matching_weights_skips_unknown_keys_and_reports_keys_the_state_lacks():
    target = _net(3)
    state = {"0.weight": torch.ones(8, 4), "extra.weight": torch.ones(2)}
    result = load_matching_weights(target, state)
    assert result.loaded == ["0.weight"] and result.skipped == ["extra.weight"]
    assert result.missing == ["0.bias", "2.weight", "2.bias"]
    assert torch.equal(target[0].weight, torch.ones(8, 4))


def test_load_matching_weights_refuses_bad_input_and_a_state_that_matches_nothing():
    with pytest.raises(TypeError, match="nn.Module and a state_dict"):
        load_matching_weights(_net(3), [torch.ones(1)])
    with pytest.raises(ValueError, match="no key of `state` matches"):
        load_matching_weights(_net(3), {f"module.{k}": v for k, v in _net(3).state_dict().items()})
    with pytest.raises(ValueError, match=r"checkpoint\['model'\]"):
        load_matching_weights(_net(3), {"format": "ptlab-checkpoint-1", "model": _net(3).state_dict()})
