# expect: nan-from-a-poisoned-sample
# One NaN in an input sample met in the 451st forward pass (3 accumulated micro-batches per step, step 151 of 180).
# Review of the watch's texts, rows 18 and 22: the inputs were checked for the first 400 forwards only, so the NaN
# loss read "from finite inputs", and the at-chance hint printed "within nan% of chance".
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
X = torch.randn(540 * 16, 8)
y = (X[:, 0] > 0).long()
X[450 * 16 + 3, 2] = float("nan")                        # BUG: a poisoned sample
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(180):
    opt.zero_grad()
    for k in range(3):
        i = (3 * step + k) * 16
        (F.cross_entropy(model(X[i:i + 16]), y[i:i + 16]) / 3).backward()
    opt.step()
print("input of forward 451 finite:", bool(torch.isfinite(X[450 * 16:451 * 16]).all()))
