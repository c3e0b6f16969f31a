# expect: fp16-without-scaler
# source: https://github.com/engichang1467/Open-Rig3R/issues/35
# "autocast defaults to fp16 with no GradScaler: gradients can silently underflow to zero ... There is no error, no
# NaN, no warning". Adapted: float16 autocast on the CPU with a loss whose gradients are small.
import sys

import torch
from torch import nn
from torch.nn import functional as F

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
X = torch.randn(256, 32)
target = 1e-3 * torch.randn(256, 1)                              # small targets: small gradients
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", enabled=FIXED)              # BUG: no scaler (FIX: an enabled one)
zero_share = []
for step in range(10):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(X), target) * 1e-3
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    zero_share.append((model[0].weight.grad == 0).float().mean().item())
    scaler.step(opt)
    scaler.update()
print(f"symptom shows: {zero_share[0] > 0.1} (share of the first layer's gradient entries that are exactly 0: "
      f"{zero_share[0]:.2f})")
