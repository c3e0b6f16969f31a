# expect: eval-without-eval-mode
# source: https://github.com/DuaneNielsen/DeepInfomaxPytorch/issues/18
# "you use batchnorm layers in encoder and do not apply model.eval() in testing stage": features for a downstream
# evaluation are computed under no_grad with the encoder still in train mode. Adapted to a small encoder.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import images

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
encoder = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                        nn.Flatten(), nn.Linear(32, 16))
head = nn.Linear(16, 4)
opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=1e-2)
for epoch in range(2):
    for X, y in DataLoader(images(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(head(encoder(X)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
before = encoder[1].running_mean.clone()
if FIXED:
    encoder.eval()                                               # FIX
X_test, _ = images(seed=1, n=64).tensors
with torch.no_grad():
    features = torch.cat([encoder(xb) for xb in X_test.split(2)])   # BUG: batches of 2 in train mode
moved = (encoder[1].running_mean - before).abs().max().item()
print(f"symptom shows: {moved > 0} (the test pass moved BatchNorm's running_mean by {moved:.3g})")
