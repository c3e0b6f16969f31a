# expect: clean
# Review K2 w2: trains with Dropout(0.3); then model.eval() with only the Dropout modules set back to train, and
# 20 stochastic passes of each test batch under no_grad (Monte Carlo dropout) for a predictive mean and spread.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

model.eval()
for m in model.modules():
    if isinstance(m, nn.Dropout):
        m.train()                                       # dropout stays on: Monte Carlo sampling
correct, spread = 0, 0.0
with torch.no_grad():
    for X, y in DataLoader(blobs(seed=1, n=256), batch_size=64):
        probs = torch.stack([model(X).softmax(1) for _ in range(20)])     # (20, B, 4)
        correct += (probs.mean(0).argmax(1) == y).sum().item()
        spread += probs.std(0).max(1).values.sum().item()
print(f"MC-dropout accuracy {correct / 256:.3f}, mean spread {spread / 256:.3f}")
