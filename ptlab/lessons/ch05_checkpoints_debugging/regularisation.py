"""Chapter 5's remedies for overfitting, one at a time, on the task of the pitfall overfitting-without-regularisation.

40 training points with 12 wrong labels, a 2-256-256-3 MLP, full-batch Adam at lr 0.01 for up to 300 steps:
the pitfall's run with exactly one change, each scored on the same validation and held-out points.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ptlab.lessons.ch05_checkpoints_debugging.blobs import noisy_blobs
from ptlab.lessons.ch05_checkpoints_debugging.pitfalls_checkpoints import _accuracy

REMEDIES = ("none", "weight decay", "dropout", "early stopping")


def train_with_remedy(remedy: str, steps: int = 300) -> dict[str, float]:
    """The overfitting run with one remedy: weight decay (AdamW, 0.1), dropout (0.5) or early stopping (patience 20).

    Returns the training, validation and held-out accuracy of the weights the run keeps, and the steps it took.
    """
    if remedy not in REMEDIES:
        raise ValueError(f"remedy must be one of {REMEDIES}, got {remedy!r}")
    X, y = noisy_blobs(n_train=40, n_wrong=12)
    X_train, y_train, X_val, y_val, X_test, y_test = X[:40], y[:40], X[40:340], y[40:340], X[340:], y[340:]
    torch.manual_seed(0)
    drop = [nn.Dropout(0.5)] if remedy == "dropout" else []           # after each hidden layer
    model = nn.Sequential(nn.Linear(2, 256), nn.ReLU(), *drop, nn.Linear(256, 256), nn.ReLU(), *drop,
                          nn.Linear(256, 3))
    if remedy == "weight decay":                         # decoupled: each step multiplies w by 1 - lr * 0.1
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    best = (float("inf"), 0, None)                                     # validation loss, step, weights
    for step in range(1, steps + 1):
        model.train()
        loss = nn.functional.cross_entropy(model(X_train), y_train)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if remedy == "early stopping":
            model.eval()
            with torch.no_grad():
                val_loss = nn.functional.cross_entropy(model(X_val), y_val).item()
            if val_loss < best[0]:
                best = (val_loss, step, copy.deepcopy(model.state_dict()))
            if step - best[1] >= 20:
                break
    if remedy == "early stopping":
        model.load_state_dict(best[2])
    model.eval()                                                       # dropout off to score
    return {"training accuracy": _accuracy(model, X_train, y_train),
            "validation accuracy": _accuracy(model, X_val, y_val),
            "held-out accuracy": _accuracy(model, X_test, y_test), "steps": float(step)}
