# expect: zero-grad-after-backward
# Detector variant: model.zero_grad(set_to_none=False) between backward() and step(): the step finds zeros, not
# None, and SGD with momentum and weight decay still moves the weights a little, but never down the gradient.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    model.zero_grad(set_to_none=False)                           # BUG: after backward, before step
    opt.step()
print(f"last loss {loss.item():.3f}")
