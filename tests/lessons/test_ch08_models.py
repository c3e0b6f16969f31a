"""Chapter 8's recurrent models: shapes, what the GRU cell loop computes, and that masked padding changes nothing."""
import pytest
import torch
from torch import nn

from ptlab.lessons.ch08_compile_export.models import GRUClassifier, TimeLoopGRU


def test_gru_classifier_maps_sequences_to_class_scores_from_the_last_state():
    torch.manual_seed(0)
    model = GRUClassifier(features=8, hidden=16, num_classes=4)
    x = torch.randn(3, 7, 8)                                                 # (B, T, features)
    assert model(x).shape == (3, 4)
    _, h = model.gru(x)
    assert torch.equal(model(x), model.head(h[-1]))
    changed = x.clone()
    changed[:, 0] += 1.0                                                     # the first step still matters
    assert not torch.allclose(model(changed), model(x))


def test_time_loop_gru_computes_what_nn_gru_computes_with_the_same_weights():
    torch.manual_seed(0)
    loop = TimeLoopGRU(features=8, hidden=16, num_classes=4)
    gru = nn.GRU(8, 16, batch_first=True)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(gru, f"{name}_l0").copy_(getattr(loop.cell, name))
    x = torch.randn(2, 9, 8)
    _, h = gru(x)
    assert torch.allclose(loop(x), loop.head(h[-1]), atol=1e-5)


@pytest.mark.parametrize("lengths", [(5, 9, 13), (1, 16, 2)])
def test_time_loop_gru_ignores_padding_past_each_length(lengths):
    torch.manual_seed(0)
    loop = TimeLoopGRU()
    sequences = [torch.randn(1, n, 8) for n in lengths]
    padded = torch.cat([nn.functional.pad(s, (0, 0, 0, 16 - s.shape[1]), value=3.0) for s in sequences])
    out = loop(padded, torch.tensor(lengths))
    expected = torch.cat([loop(s) for s in sequences])
    assert torch.allclose(out, expected, atol=1e-5)
    assert not torch.allclose(loop(padded), expected, atol=1e-3), "without lengths the padding counts"
