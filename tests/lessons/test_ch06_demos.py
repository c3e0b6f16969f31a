"""Chapter 6's gradient accumulation fixture (ptlab.lessons.ch06_amp.demos)."""
import copy

import pytest
import torch
from torch import nn

from ptlab.lessons.ch06_amp.demos import accumulated_amp_step


def _data():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 8, generator=g)                    # (64, 8)
    return X, X @ torch.randn(8, 1, generator=g)           # (64, 1)


def _update(start, X, y, k, max_norm=1.0):
    model = copy.deepcopy(start)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    norm = accumulated_amp_step(model, torch.optim.SGD(model.parameters(), lr=0.1), scaler,
                                list(zip(X.chunk(k), y.chunk(k))), max_norm=max_norm)
    delta = torch.cat([(p - q).detach().flatten() for p, q in zip(model.parameters(), start.parameters())])
    return delta, norm, scaler


def test_accumulated_amp_step_matches_the_whole_batch_and_a_float32_step():
    X, y = _data()
    torch.manual_seed(0)
    start = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    whole, whole_norm, _ = _update(start, X, y, 1)
    four, four_norm, scaler = _update(start, X, y, 4)
    assert (four - whole).abs().max() / whole.abs().max() < 1e-2
    assert abs(four_norm - whole_norm) / whole_norm < 1e-2
    assert scaler.get_scale() == 1024.0                    # one update(), no inf: the scale did not move
    reference = copy.deepcopy(start)                       # the same step in float32, without a scaler
    nn.functional.mse_loss(reference(X), y).backward()
    grads = [p.grad for p in reference.parameters()]
    norm = torch.cat([g.flatten() for g in grads]).norm()
    expected = torch.cat([(-0.1 * g * min(1.0, 1.0 / (norm.item() + 1e-6))).flatten() for g in grads])
    assert abs(whole_norm - norm.item()) / norm.item() < 1e-2
    assert (whole - expected).abs().max() / expected.abs().max() < 1e-2


def test_accumulated_amp_step_refuses_no_micro_batches():
    model = nn.Linear(8, 1)
    with pytest.raises(ValueError, match="micro_batches"):
        accumulated_amp_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu"), [])

