# expect: eval-without-eval-mode
# Review K2 w5b: correct training, then an evaluation with neither model.eval() nor torch.no_grad(), at batch 8,
# accuracy through .item(): BatchNorm normalises each batch of 8 with its own statistics.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(2):
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
correct = 0
for X, y in DataLoader(blobs(seed=1, n=512), batch_size=8):
    correct += (model(X).argmax(1) == y).sum().item()           # BUG: train mode, gradients on
print(f"test accuracy {correct / 512:.3f}")
