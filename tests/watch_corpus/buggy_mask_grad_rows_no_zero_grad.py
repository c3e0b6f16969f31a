# expect: missing-zero-grad-training
# Review 2 of the watch's texts, C1: no zero_grad(); the only write into a .grad is `emb.weight.grad[frozen] = 0`,
# which keeps 10 embedding rows frozen. It resets those rows only: every other gradient piles up.
import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs().tensors
idx = (X[:, 0].abs() * 10).long() % 50
emb = nn.Embedding(50, 8)
head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD([*emb.parameters(), *head.parameters()], lr=0.05)
frozen = torch.arange(0, 10)
for s in range(30):
    b = slice(32 * s, 32 * s + 32)
    loss = F.cross_entropy(head(torch.cat([X[b], emb(idx[b])], 1)), y[b])
    loss.backward()                                             # BUG: no opt.zero_grad()
    emb.weight.grad[frozen] = 0                                 # keep rows 0-9 frozen: a partial write, no reset
    opt.step()
