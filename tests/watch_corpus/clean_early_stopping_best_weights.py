# expect: clean
# Early stopping: validate every epoch (eval mode, no_grad), keep a copy of the best state_dict, stop after 3 epochs
# without improvement, and load the best weights back.
import copy

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
train, val = blobs(n=128, spread=1.0), blobs(n=256, seed=1, spread=1.0)
model = nn.Sequential(nn.Linear(8, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 4))
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
best, best_state, waited = float("inf"), None, 0
for epoch in range(30):
    model.train()
    for X, y in DataLoader(train, batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val_loss = sum(F.cross_entropy(model(X), y, reduction="sum").item()
                       for X, y in DataLoader(val, batch_size=64)) / len(val)
    if val_loss < best:
        best, best_state, waited = val_loss, copy.deepcopy(model.state_dict()), 0
    else:
        waited += 1
        if waited == 3:
            break
model.load_state_dict(best_state)
print(f"stopped after epoch {epoch}, best validation loss {best:.3f}")
