# expect: shuffle-off-for-training
# source: https://github.com/Deci-AI/super-gradients/issues/416
# "By default, it does not pass shuffle=True to the dataloader, so SequentialSampler gets instantiated. In training
# on Imagenet it makes NN see only examples of a single class". Adapted: a data set stored class by class.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _data import blobs

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
X, y = blobs(n=1024, spread=1.0).tensors
order = torch.argsort(y, stable=True)                            # stored class by class, as folders are
train = TensorDataset(X[order], y[order])
dataloader_params = {"batch_size": 32, **({"shuffle": True} if FIXED else {})}   # BUG: shuffle defaults to False
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for X_b, y_b in DataLoader(train, **dataloader_params):
    loss = F.cross_entropy(model(X_b), y_b)
    opt.zero_grad()
    loss.backward()
    opt.step()
X_test, y_test = blobs(seed=1, n=256, spread=1.0).tensors
with torch.no_grad():
    last_class = (model(X_test).argmax(1) == 3).float().mean().item()
print(f"symptom shows: {last_class > 0.5} (share of balanced test points predicted as class 3, the last class the "
      f"epoch ended on: {last_class:.2f}; about 0.25 when it learns all four)")
