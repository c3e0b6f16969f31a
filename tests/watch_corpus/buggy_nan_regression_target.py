# expect: nan-from-a-poisoned-sample
# A regression whose loss falls; one target value is NaN in the batch of step 20 (a poisoned label, with finite
# inputs and a sane learning rate). Review of the watch's texts, rows 22b and 23: it was named an exploding gradient
# "after rising from 3.82 to 3.82".
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
X = torch.randn(640, 8)
Y = X @ torch.randn(8, 1) + 0.1 * torch.randn(640, 1)
Y[19 * 32 + 5] = float("nan")                            # BUG: a poisoned target
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20):
    xb, yb = (X[608:], Y[608:]) if step == 19 else (X[:512], Y[:512])
    loss = F.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step in (0, 18, 19):
        print(step + 1, f"loss {loss.item():.3g}")
