# expect: missing-zero-grad-training
# source: https://github.com/facebookresearch/nwm/issues/16
# "Missing opt.zero_grad() when bfloat16 is enabled causes silent gradient accumulation": the gradients are zeroed
# only on the float32 code path. Adapted with bfloat16 autocast on the CPU.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
bfloat_enable = True


def train_step(X, y):
    if not bfloat_enable or FIXED:                               # BUG: zeroed on the float32 path only
        opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat_enable):
        loss = F.cross_entropy(model(X), y)
    loss.backward()
    opt.step()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()


norms = [train_step(X, y) for X, y in DataLoader(blobs(n=1280), batch_size=32, shuffle=True)]
ratio = sum(norms[-5:]) / sum(norms[:5])
print(f"symptom shows: {ratio > 0.5} (the gradient each step applies: norm over the last 5 steps / over the first 5 = "
      f"{ratio:.2f}; as the model learns it shrinks, unless gradients pile up)")
