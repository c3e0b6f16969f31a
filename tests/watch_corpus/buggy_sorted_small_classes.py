# expect: shuffle-off-for-training
# Detector variant: data sorted by label with only 12 examples per class and batches of 32, so each batch holds
# 3-4 classes (not one), in sorted order; the loader does not shuffle.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _data import blobs

torch.manual_seed(0)
X, y = blobs(n=4000, classes=100).tensors
order = torch.argsort(y, stable=True)
keep = torch.cat([order[y[order] == k][:12] for k in range(100)])     # 12 per class, in label order
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 100))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(2):
    for X_b, y_b in DataLoader(TensorDataset(X[keep], y[keep]), batch_size=32):   # BUG: no shuffle=True
        loss = F.cross_entropy(model(X_b), y_b)
        opt.zero_grad()
        loss.backward()
        opt.step()
print(f"last loss {loss.item():.3f}")
