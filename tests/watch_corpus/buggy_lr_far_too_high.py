# expect: exploding-gradients-nan
# runs: --steps 9 | --steps 10 | --steps 20
# Review K2 w6: plain SGD at lr 5 on features of scale 30: the loss rises to ~1e34, then is NaN at step 9. With 9
# steps no forward pass runs after it, so the finding must not say what a later one found.
import argparse

import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()
torch.manual_seed(0)
X, y = blobs(n=256, classes=10).tensors
X = 30 * X                                                      # unnormalised features
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=5.0)               # BUG: far too high for this scale
for step in range(args.steps):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step + 1}: loss {loss.item():.3g}")
