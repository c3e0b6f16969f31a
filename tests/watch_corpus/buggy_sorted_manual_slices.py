# expect: shuffle-off-for-training
# Detector variant: no DataLoader at all; batches sliced in order from tensors stored class by class.
import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs(n=1200, classes=6).tensors
order = torch.argsort(y, stable=True)
X, y = X[order], y[order]                                        # stored class by class
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 6))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for start in range(0, 1200, 24):
    loss = F.cross_entropy(model(X[start:start + 24]), y[start:start + 24])   # BUG: slices in stored order
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")
