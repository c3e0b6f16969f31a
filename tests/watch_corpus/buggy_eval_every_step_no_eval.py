# expect: eval-without-eval-mode
# Review 2 of the watch's texts, C2: a validation loss after EVERY step, under no_grad but without model.eval():
# BatchNorm normalises with the validation batch's statistics and its running statistics move at each step.
import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs().tensors
Xv, yv = blobs(n=64, seed=1).tensors
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for s in range(30):
    model.train()
    b = slice(32 * s, 32 * s + 32)
    loss = F.cross_entropy(model(X[b]), y[b])
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():                                       # BUG: no model.eval()
        before = model[1].running_mean.clone()
        val = F.cross_entropy(model(Xv), yv)
        drift = float((model[1].running_mean - before).abs().max())
print("last validation loss", round(val.item(), 3), "running_mean moved by that pass", round(drift, 4))
