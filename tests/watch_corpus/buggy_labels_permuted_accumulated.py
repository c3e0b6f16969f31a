# expect: hint shuffled-labels
# Inputs and labels permuted separately, with 4 accumulated micro-batches per optimizer step: 100 optimizer steps,
# 400 cross_entropy calls. Review of the watch's texts, row 17: the hint counted the calls as training steps.
import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs(n=3200, classes=10).tensors
X, y = X[torch.randperm(len(X))], y[torch.randperm(len(y))]     # BUG: each permuted on its own
model = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
steps = 0
for start in range(0, 3200, 32):
    opt.zero_grad()
    for k in range(4):
        part = slice(start + 8 * k, start + 8 * k + 8)
        (F.cross_entropy(model(X[part]), y[part]) / 4).backward()
    opt.step()
    steps += 1
print("optimizer steps:", steps)
