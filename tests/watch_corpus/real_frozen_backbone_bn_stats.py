# expect: frozen-backbone-batchnorm-train-mode
# source: https://github.com/lightly-ai/lightly/issues/1438
# "deactivate_requires_grad does not fix the model! ... the batchnorm statistics (running_mean, running_var, etc.)
# are still being updated": a linear probe on a frozen backbone, trained with the whole model in train mode.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import images

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
backbone = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                         nn.Flatten())
model = nn.Sequential(backbone, nn.Linear(32, 4))
for p in backbone.parameters():
    p.requires_grad = False                                      # "deactivate_requires_grad"
before = backbone[1].running_mean.clone()
opt = torch.optim.SGD(model[1].parameters(), lr=0.1)
for epoch in range(2):
    model.train()                                                # BUG: the frozen backbone's BatchNorm trains too
    if FIXED:
        backbone.eval()                                          # FIX
    for X, y in DataLoader(images(seed=5), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
moved = (backbone[1].running_mean - before).abs().max().item()
print(f"symptom shows: {moved > 0} (the frozen backbone's running_mean moved by {moved:.3g})")
