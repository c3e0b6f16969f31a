# expect: clean
# Gradient accumulation over 4 micro-batches with float16 autocast and a GradScaler: the loss is divided by 4,
# unscale_ runs once per step before clip_grad_norm_, then scaler.step, scaler.update and zero_grad.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cpu")
K = 4
for epoch in range(2):
    for i, (X, y) in enumerate(DataLoader(blobs(), batch_size=16, shuffle=True)):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(X), y) / K
        scaler.scale(loss).backward()
        if (i + 1) % K == 0:
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
    print(f"epoch {epoch}: loss {loss.item() * K:.3f}")
