# expect: clean
# Two heads on one trunk (classification and regression), two losses summed with weights, one backward per step;
# the running totals are Python floats.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _data import blobs

torch.manual_seed(0)
X, y = blobs().tensors
r = X.sum(1, keepdim=True)                               # a regression target, (N, 1)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(8, 64), nn.ReLU())
        self.cls, self.reg = nn.Linear(64, 4), nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.cls(h), self.reg(h)


model = TwoHeads()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(2):
    total_cls = total_reg = 0.0
    for xb, yb, rb in DataLoader(TensorDataset(X, y, r), batch_size=32, shuffle=True):
        logits, pred = model(xb)
        loss_cls, loss_reg = F.cross_entropy(logits, yb), F.smooth_l1_loss(pred, rb)
        loss = loss_cls + 0.1 * loss_reg
        opt.zero_grad()
        loss.backward()
        opt.step()
        total_cls += loss_cls.item()
        total_reg += loss_reg.item()
    print(f"epoch {epoch}: classification {total_cls:.2f}, regression {total_reg:.2f}")
