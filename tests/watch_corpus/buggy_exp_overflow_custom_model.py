# expect: exploding-gradients-nan
# A custom model with no parameters of its own (only a submodule) whose forward computes exp() itself; at lr 0.5
# the exp overflows. The script skips the step on a non-finite loss, so the weights stay finite (checked below).
# Review of the watch's texts, row 25: the text said its own weights were already non-finite.
import torch
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x):
        return torch.exp(self.fc(x))


torch.manual_seed(0)
X = torch.randn(512, 8)
Y = torch.exp(X[:, :1])
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)       # BUG: too high for an exp output
for step in range(30):
    xb, yb = X[step * 16 % 512:][:16], Y[step * 16 % 512:][:16]
    loss = F.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    if not torch.isfinite(loss):
        continue                                         # a guard: nothing non-finite reaches the weights
    opt.step()
assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
print("weights finite at the end")
