# expect: clean
# bfloat16 autocast on the CPU: bfloat16 has float32's exponent range, so no GradScaler is needed.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import images

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                      nn.Flatten(), nn.Linear(128, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for epoch in range(2):
    for X, y in DataLoader(images(), batch_size=32, shuffle=True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
