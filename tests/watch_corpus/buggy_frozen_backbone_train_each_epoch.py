# expect: frozen-backbone-batchnorm-train-mode
# Detector variant: the backbone is frozen and put in eval mode once, before the loop; model.train() at the start of
# every epoch puts its BatchNorm back in train mode.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.BatchNorm1d(64),
                      nn.ReLU(), nn.Linear(64, 4))
for layer in list(model)[:6]:
    layer.requires_grad_(False)
    layer.eval()                                                 # frozen, once
opt = torch.optim.SGD(model[6].parameters(), lr=0.05, momentum=0.9)
for epoch in range(2):
    model.train()                                                # BUG: the frozen BatchNorms train again
    for X, y in DataLoader(blobs(seed=4), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
