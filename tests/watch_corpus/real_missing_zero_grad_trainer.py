# expect: missing-zero-grad-training
# source: https://github.com/yastrebksv/TennisCourtDetector/issues/7
# "Why there is no optimizer.zero_grad() in base_trainer.py?" (the author: "You are right, thanks! I fixed it.")
# Adapted: a heatmap regressor trained with MSE by a train() helper that steps without ever zeroing.
import sys

import torch
from torch import nn
from torch.nn import functional as F

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
X = torch.randn(512, 16)
Y = torch.sigmoid(X @ torch.randn(16, 8))                        # 8 "heatmap" values per input
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8), nn.Sigmoid())
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def train(model, batches):
    norms = []
    for xb, yb in batches:
        if FIXED:
            optimizer.zero_grad()                                # FIX
        loss = F.mse_loss(model(xb), yb)
        loss.backward()                                          # BUG: .grad keeps every earlier batch's gradient
        optimizer.step()
        norms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())
    return norms


norms = [n for epoch in range(2) for n in train(model, zip(X.split(32), Y.split(32)))]
ratio = sum(norms[-4:]) / sum(norms[:4])
print(f"symptom shows: {ratio > 3} (the gradient each step applies: norm over the last 4 steps / over the first 4 = "
      f"{ratio:.2f})")
