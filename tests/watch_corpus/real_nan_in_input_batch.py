# expect: nan-from-a-poisoned-sample
# source: https://github.com/prs-eth/Marigold/issues/111
# "loss=nan occurs during training ... I notice that this happens when input batch contains NaN values."
# Adapted: one sample of the training set holds a NaN feature.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _data import blobs

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
X, y = blobs().tensors
X = X.clone()
X[321, 4] = float("nan")                                         # BUG: one unreadable value in the data
if FIXED:
    keep = torch.isfinite(X).all(dim=1)                          # FIX: drop (or repair) bad samples
    X, y = X[keep], y[keep]
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for xb, yb in DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
nan_weights = sum(bool(torch.isnan(p).any()) for p in model.parameters())
print(f"symptom shows: {nan_weights > 0} (weight tensors holding NaN after one epoch: {nan_weights} of 4)")
