# expect: clip-without-unscale
# source: https://github.com/milesial/Pytorch-UNet/issues/468
# "Gradients are clipped before the unscaling ... scaler.unscale_(optimizer) should be added before gradient
# clipping." Adapted with float16 autocast and a GradScaler on the CPU.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import images

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))   # a tiny "UNet"
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=4096.0)
for X, _ in DataLoader(images(n=256), batch_size=16, shuffle=True):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(X), (X > 1).float())
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if FIXED:
        scaler.unscale_(opt)                                     # FIX
    norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)     # BUG: clips the scaled gradients
    scaler.step(opt)
    scaler.update()
print(f"symptom shows: {norm.item() > 100} (the norm clip_grad_norm_ saw = {norm.item():.4g}; the true one is "
      f"about 1 or less)")
