# expect: missing-zero-grad-training
# Detector variant: no zero_grad() under a GradScaler whose unscale_ and the clip both write into .grad in place
# every step; neither is a reset.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
for X, y in DataLoader(blobs(n=640), batch_size=32, shuffle=True):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(X), y)
    scaler.scale(loss).backward()                                # BUG: no opt.zero_grad() anywhere
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    scaler.step(opt)
    scaler.update()
print(f"last loss {loss.item():.3f}")
