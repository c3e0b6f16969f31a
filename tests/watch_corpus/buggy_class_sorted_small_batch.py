# expect: shuffle-off-for-training
# runs: --batch 16 | --batch 19 | --batch 20 | --batch 32
# Review K2 w5c: 10 classes stored class by class and shuffle=False, at batch sizes below and above twice the class
# count: each batch holds one or two classes.
import argparse

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _data import blobs

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=16)
args = parser.parse_args()
torch.manual_seed(0)
X, y = blobs(n=2000, classes=10).tensors
order = torch.argsort(y, stable=True)                          # stored class by class
train = TensorDataset(X[order], y[order])
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for X_b, y_b in DataLoader(train, batch_size=args.batch, shuffle=False):  # BUG: shuffle=False on sorted data
    loss = F.cross_entropy(model(X_b), y_b)
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    print(f"accuracy {(model(X).argmax(1) == y).float().mean().item():.3f}")
