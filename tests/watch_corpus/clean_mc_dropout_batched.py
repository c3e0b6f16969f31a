# expect: clean
# Review 2 of the watch's texts, C4: Monte Carlo dropout batched. After training, model.train() under no_grad on
# purpose, and each test batch tiled 20 times inside ONE forward (x.repeat); the 20 samples give a mean and spread.
import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs().tensors
Xt, yt = blobs(n=256, seed=1).tensors
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for s in range(30):
    b = slice(32 * s, 32 * s + 32)
    loss = F.cross_entropy(model(X[b]), y[b])
    opt.zero_grad()
    loss.backward()
    opt.step()
model.train()                                                   # dropout on, on purpose: MC sampling
with torch.no_grad():
    probs = [model(xb.repeat(20, 1)).softmax(1).view(20, -1, 4) for xb in Xt.split(64)]
mean = torch.cat([p.mean(0) for p in probs])
print("MC accuracy", round(float((mean.argmax(1) == yt).float().mean()), 3))
