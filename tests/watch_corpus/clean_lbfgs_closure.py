# expect: clean
# L-BFGS with a closure that zeroes, computes the loss and backpropagates; step() calls it several times.
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
X = torch.randn(200, 5)
y = X @ torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0]) + 0.1 * torch.randn(200)
model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=10, history_size=10)


def closure():
    opt.zero_grad()
    loss = F.mse_loss(model(X).squeeze(1), y)
    loss.backward()
    return loss


for step in range(8):
    loss = opt.step(closure)
print(f"final loss {loss.item():.4f}")
