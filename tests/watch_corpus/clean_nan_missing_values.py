# expect: clean
# Review 2 of the watch's texts, C4b: NaN marks missing features by design and the model fills them itself (a
# learned fill value plus a missing-indicator); every loss is finite (asserted) and the model learns.
import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs().tensors
X = X.clone()
X[torch.rand_like(X) < 0.1] = float("nan")                      # 10% missing, marked NaN


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fill = nn.Parameter(torch.zeros(8))
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        miss = x.isnan()
        x = torch.where(miss, self.fill.expand_as(x), x)
        return self.mlp(torch.cat([x, miss.float()], 1))


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for s in range(30):
    b = slice(32 * s, 32 * s + 32)
    loss = F.cross_entropy(model(X[b]), y[b])
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
model.eval()
with torch.no_grad():
    print("all losses finite; accuracy", round(float((model(X).argmax(1) == y).float().mean()), 3))
