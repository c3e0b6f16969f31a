"""Chapter 2's fixtures: the pitfalls' regression batch, what they measure, and the model of the plain-list pitfall."""
from __future__ import annotations

import torch
from torch import nn


def regression_batch(seed: int = 0, n: int = 32, features: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed batch: X (n, features), y (n, 1) = a linear function of X plus noise."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, features, generator=g)                      # (n, F)
    y = X @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)  # (n, 1)
    return X, y


def grad_norm(model: nn.Module) -> float:
    """The L2 norm of all parameter gradients together."""
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm().item()


def max_change(before: list[torch.Tensor], layers: list[nn.Module]) -> float:
    """Largest absolute change of any weight in layers since the snapshot."""
    return max((b - p.detach()).abs().max().item() for b, p in zip(before, (layer.weight for layer in layers)))


def graph_nodes(t: torch.Tensor) -> int:
    """How many autograd nodes a backward from t walks through: the size of the graph behind t."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(parent for parent, _ in node.next_functions)
    return len(seen)


class ListMLP(nn.Module):
    """Hidden layers, then a head (16 -> 1). `hidden` holds the hidden layers: assigned a plain list, nn.Module
    does not register them; assigned an nn.ModuleList, it does. Pass it here or assign `model.hidden` later."""

    def __init__(self, hidden: list[nn.Module] | nn.ModuleList | None = None):
        super().__init__()
        self.head = nn.Linear(16, 1)
        if hidden is not None:
            self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = torch.relu(layer(x))                       # (B, 16)
        return self.head(x)                                # (B, 1)
