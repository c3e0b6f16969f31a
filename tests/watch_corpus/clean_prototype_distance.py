# expect: clean
# A regression to class prototypes: mse_loss between a (1, D) prototype and a (B, D) batch broadcasts the prototype
# on purpose (the target is not stretched twice), plus a per-sample regression with matching (B, 1) shapes.
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
X = torch.randn(64, 8)
y = X[:, :1] * 2 - 1                                        # (64, 1)
net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
prototype = nn.Parameter(torch.zeros(1, 8))
opt = torch.optim.SGD([*net.parameters(), prototype], lr=0.05)
for step in range(60):
    loss = F.mse_loss(net(X), y) + 0.1 * F.mse_loss(prototype.expand(64, 8) if step % 2 else prototype, X)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss {loss.item():.3f}, prototype norm {prototype.norm().item():.3f}")
