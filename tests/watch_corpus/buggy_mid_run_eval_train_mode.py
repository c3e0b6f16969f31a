# expect: eval-without-eval-mode
# Review K2 w7: train 20 steps, evaluate one batch in train mode under no_grad, then train 100 steps more.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
batches = iter(DataLoader(blobs(n=120 * 32), batch_size=32, shuffle=True))
X_val, y_val = blobs(seed=1, n=64).tensors
for step in range(120):
    X, y = next(batches)
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 19:
        with torch.no_grad():
            accuracy = (model(X_val).argmax(1) == y_val).float().mean().item()   # BUG: still train mode
        print(f"after 20 steps: validation accuracy {accuracy:.3f}")
