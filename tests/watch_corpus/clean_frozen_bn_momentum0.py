# expect: clean
# A frozen backbone whose BatchNorm statistics are frozen with momentum=0 instead of .eval(): in train mode its
# running statistics cannot move (checked below). Review of the watch's texts, row 33: it was told they keep moving.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))
for layer in list(model)[:3]:
    layer.requires_grad_(False)
model[1].momentum = 0.0                                  # running statistics frozen this way
before = model[1].running_mean.clone()
opt = torch.optim.SGD(model[3].parameters(), lr=0.05)
model.train()
for X, y in DataLoader(blobs(seed=4), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
assert torch.equal(model[1].running_mean, before)
print(f"running_mean unchanged; loss {loss.item():.3f}")
