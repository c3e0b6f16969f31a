# expect: broadcast-loss-shape
# Detector variant: a (B,) prediction against a (B, 1) target with l1_loss: (B,) - (B, 1) broadcasts to (B, B).
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
X = torch.randn(64, 3)
y = (X @ torch.tensor([[1.0], [-2.0], [0.5]])) + 0.1 * torch.randn(64, 1)   # (64, 1)
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(30):
    loss = F.l1_loss(model(X).squeeze(1), y)                    # BUG: (64,) against (64, 1)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")
