# expect: missing-zero-grad-training
# Detector variant: zero_grad() at the start of each epoch only, so within an epoch of 32 steps every step adds
# to the gradients of all the steps before it.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    opt.zero_grad()                                              # BUG: once per epoch, not once per step
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
