# expect: running-loss-keeps-graph
# Detector variant: a validation loop in eval mode but without no_grad, summing loss * batch size as tensors: every
# batch's graph and activations stay alive until the total is freed.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
total = 0
for X, y in DataLoader(blobs(seed=1, n=512), batch_size=32):
    total = total + F.cross_entropy(model(X), y) * len(X)       # BUG: a tensor with a grad_fn
print(f"validation loss {total.item() / 512:.3f}")
