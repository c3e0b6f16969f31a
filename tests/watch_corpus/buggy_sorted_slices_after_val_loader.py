# expect: shuffle-off-for-training
# A baseline evaluation iterates a validation DataLoader (shuffle=False, as validation should); training then slices
# class-sorted tensors in order, with no DataLoader. Review of the watch's texts, row 16: the finding blamed "its
# DataLoader", the validation one.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
X, y = blobs(n=1600, classes=4).tensors
order = y.argsort()
X, y = X[order], y[order]                                # BUG: sorted by class, then sliced in order
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
with torch.no_grad():
    correct = sum((model(a).argmax(1) == b).sum().item() for a, b in DataLoader(blobs(n=256, seed=1), batch_size=64))
print(f"baseline accuracy {correct / 256:.3f}")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for start in range(0, 1600, 32):
    loss = F.cross_entropy(model(X[start:start + 32]), y[start:start + 32])
    opt.zero_grad()
    loss.backward()
    opt.step()
