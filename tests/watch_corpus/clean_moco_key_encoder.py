# expect: clean
# Review K2 w1: MoCo-style contrastive training. The key encoder is a momentum copy with requires_grad=False, run in
# train mode under no_grad on purpose (as MoCo does, its BatchNorm uses the key batch's statistics), with a queue of
# keys; the targets are all 0 (the positive key is column 0).
import copy

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
encoder_q = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 16))
encoder_k = copy.deepcopy(encoder_q)
for p in encoder_k.parameters():
    p.requires_grad = False
opt = torch.optim.SGD(encoder_q.parameters(), lr=0.05, momentum=0.9)
queue = F.normalize(torch.randn(128, 16), dim=1)
loader = DataLoader(blobs(), batch_size=32, shuffle=True)
m, T = 0.99, 0.2
for epoch in range(2):
    for X, _ in loader:
        view_q, view_k = X + 0.3 * torch.randn_like(X), X + 0.3 * torch.randn_like(X)   # two augmentations
        q = F.normalize(encoder_q(view_q), dim=1)                                      # (B, 16)
        with torch.no_grad():
            for pq, pk in zip(encoder_q.parameters(), encoder_k.parameters()):
                pk.mul_(m).add_(pq.detach(), alpha=1 - m)                              # momentum update
            k = F.normalize(encoder_k(view_k), dim=1)                                  # train mode on purpose
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / T     # (B, 1 + 128)
        loss = F.cross_entropy(logits, torch.zeros(len(X), dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        queue = torch.cat([k, queue])[:128]
    print(f"epoch {epoch}: contrastive loss {loss.item():.3f}")
