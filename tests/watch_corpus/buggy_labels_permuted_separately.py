# expect: hint shuffled-labels
# Detector variant: inputs and labels shuffled with two different permutations, so no label belongs to its input.
# What runs cannot tell this from a model that cannot learn the task: the watch may only hint at it.
import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs(n=3200, classes=10).tensors
X = X[torch.randperm(len(X))]                                    # BUG: a permutation for the inputs...
y = y[torch.randperm(len(y))]                                    # ...and another one for the labels
model = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for start in range(0, 3200, 32):
    loss = F.cross_entropy(model(X[start:start + 32]), y[start:start + 32])
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")
