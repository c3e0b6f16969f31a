# expect: clean
# Freeze the backbone for the first epoch (an optimizer over the head only, backbone in eval mode), then unfreeze it
# and add its parameters as a second param group with a smaller learning rate.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU())
head = nn.Linear(64, 4)
backbone.requires_grad_(False)
opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
for epoch in range(3):
    if epoch == 1:
        backbone.requires_grad_(True)
        opt.add_param_group({"params": backbone.parameters(), "lr": 1e-3})
    backbone.train(epoch >= 1)
    head.train()
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(head(backbone(X)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
