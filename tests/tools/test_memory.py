"""ptlab.memory: each part of a training step's memory, measured and checked against what it must be."""
import pytest
import torch
from torch import nn

from ptlab.memory import SavedTensors, memory_breakdown, tensor_bytes


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(100, 200), nn.ReLU(), nn.Linear(200, 10))


BATCH = (torch.randn(32, 100), torch.randint(0, 10, (32,)))
PARAM_BYTES = (100 * 200 + 200 + 200 * 10 + 10) * 4


@pytest.mark.parametrize("make_optimizer, state_bytes", [
    (lambda p: torch.optim.AdamW(p, lr=1e-3), 2 * PARAM_BYTES + 4 * 4),   # exp_avg, exp_avg_sq, a 0-d step each
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), PARAM_BYTES),      # one momentum buffer
    (lambda p: torch.optim.SGD(p, lr=0.1), 0),
])
def test_parts_match_what_the_shapes_say(make_optimizer, state_bytes):
    model = _mlp()
    optimizer = make_optimizer(model.parameters())
    before = [p.clone() for p in model.parameters()]
    parts = memory_breakdown(model, optimizer, BATCH)
    assert parts.parameters == parts.gradients == PARAM_BYTES
    assert parts.optimizer_state == state_bytes
    relu_out, log_probs = 32 * 200 * 4, 32 * 10 * 4
    assert 0 <= parts.activations - (relu_out + log_probs) <= 64  # + nll_loss's 0-d total weight
    assert parts.batch == 32 * 100 * 4 + 32 * 8
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and not optimizer.state, \
        "the learner's model and optimizer must be left as they were"


def test_views_are_counted_once_and_saved_tensors_outside_the_block_are_not():
    x = torch.zeros(1000)
    assert tensor_bytes([x, x[:10], x.view(10, 100)]) == 4000
    w = torch.randn(50, 50, requires_grad=True)
    with SavedTensors(exclude=[w]) as saved:
        (w.exp() * 2).sum()
    assert saved.bytes == 50 * 50 * 4  # exp saves its result; the input w is excluded


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="nn.Module and a torch optimizer"):
        memory_breakdown(_mlp(), None, BATCH)


def test_a_batch_sliced_from_a_dataset_counts_its_own_bytes_and_names_the_storage_it_keeps_alive():
    images, labels = torch.randn(1000, 100), torch.randint(0, 10, (1000,))   # the whole data set in memory
    parts = memory_breakdown(_mlp(), torch.optim.SGD(_mlp().parameters(), lr=0.1), (images[:32], labels[:32]))
    assert parts.batch == 32 * 100 * 4 + 32 * 8                              # what the batch's views cover
    assert parts.batch_storage == 1000 * 100 * 4 + 1000 * 8                  # what they keep alive
    assert parts.total == parts.parameters + parts.gradients + parts.optimizer_state + parts.activations + parts.batch
    line = str(parts).splitlines()[-1]
    assert line.startswith("the input batch is a view") and "0.39 MiB (408,000 bytes) of storage alive" in line, line
    owned = memory_breakdown(_mlp(), torch.optim.SGD(_mlp().parameters(), lr=0.1), BATCH)
    assert owned.batch == owned.batch_storage and "view" not in str(owned)
