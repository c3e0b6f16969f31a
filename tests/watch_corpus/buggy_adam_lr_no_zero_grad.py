# expect: missing-zero-grad-training learning-rate-too-high
# Review 2 of the watch's texts, C3: two bugs, Adam at lr 10 and no zero_grad(). The loss shoots up with zero_grad()
# too (--zero-grad gives learning-rate-too-high alone, tested in test_watch_texts.py), so the rise is no consequence
# of the pile: two causes.
import sys

import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs().tensors
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=10)
for s in range(30):
    b = slice(32 * s, 32 * s + 32)
    if "--zero-grad" in sys.argv:
        opt.zero_grad()
    loss = F.cross_entropy(model(X[b]), y[b])
    loss.backward()                                             # BUG (without --zero-grad): no opt.zero_grad()
    opt.step()
