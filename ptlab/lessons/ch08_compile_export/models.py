"""Chapter 8's models: an MLP, a tiny transformer block, two recurrent classifiers, a softmax over the sequence dim,
a branch on the batch size, and a function wrapped as a module, each chosen for what compiling or exporting it shows."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def make_mlp(in_features: int = 64, hidden: int = 256, num_classes: int = 10) -> nn.Sequential:
    """A 2-hidden-layer MLP: (B, in_features) -> (B, num_classes)."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


class TinyTransformerBlock(nn.Module):
    """Pre-norm causal self-attention (F.scaled_dot_product_attention) and an MLP: (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int = 32, heads: int = 4) -> None:
        super().__init__()
        if not isinstance(d_model, int) or not isinstance(heads, int) or heads < 1 or d_model % heads:
            raise ValueError(f"d_model must be a multiple of heads, got d_model={d_model!r}, heads={heads!r}")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(D, dim=-1)                     # 3 x (B, T, D)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D/H)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, H, T, D/H)
        x = x + self.proj(attended.transpose(1, 2).reshape(B, T, D))          # (B, T, D)
        return x + self.mlp(self.norm2(x))                                    # (B, T, D)


class GRUClassifier(nn.Module):
    """nn.GRU over the sequence, then a Linear on the last hidden state: (B, T, features) -> (B, num_classes)."""

    def __init__(self, features: int = 8, hidden: int = 16, num_classes: int = 4) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(x)                      # h: (1, B, hidden), the state after the last step
        return self.head(h[-1])                 # (B, num_classes)


class TimeLoopGRU(nn.Module):
    """An nn.GRUCell stepped in a Python loop over T, then a Linear: (B, T, features) -> (B, num_classes).

    With `lengths` (B,), sequence b keeps its state after step lengths[b]: padding past a length changes nothing.
    """

    def __init__(self, features: int = 8, hidden: int = 16, num_classes: int = 4) -> None:
        super().__init__()
        self.cell = nn.GRUCell(features, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)                   # (B, hidden)
        for t in range(x.shape[1]):                                            # T steps: a Python int
            stepped = self.cell(x[:, t], h)                                    # (B, hidden)
            h = stepped if lengths is None else torch.where((t < lengths)[:, None], stepped, h)
        return self.head(h)                                                   # (B, num_classes)


class SoftmaxOverSequence(nn.Module):
    """(B, T, 8) -> (B, T, 8): a linear map, then a softmax over the sequence dim T."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).softmax(dim=1)


class DoubleLargeBatches(nn.Module):
    """Doubles its input when the batch has more than 16 rows: a branch on a shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 16:
            return x * 2
        return x


class FunctionModule(nn.Module):
    """A plain function `fn(x)` as a module, so that torch.export (which takes modules) can export it."""

    def __init__(self, fn) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"FunctionModule needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)
