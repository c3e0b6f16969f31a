# expect: missing-zero-grad-training
# Detector variant: two optimizers (backbone and head); only the head's is zeroed, so the backbone's gradients pile
# up while the head's reset every step (a reset of one optimizer must not end the other's streak).
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
backbone, head = nn.Sequential(nn.Linear(8, 64), nn.ReLU()), nn.Linear(64, 4)
opt_backbone = torch.optim.SGD(backbone.parameters(), lr=0.01)
opt_head = torch.optim.SGD(head.parameters(), lr=0.05)
for X, y in DataLoader(blobs(n=640), batch_size=32, shuffle=True):
    loss = F.cross_entropy(head(backbone(X)), y)
    opt_head.zero_grad()                                         # BUG: opt_backbone.zero_grad() is missing
    loss.backward()
    opt_backbone.step()
    opt_head.step()
print(f"last loss {loss.item():.3f}")
