# expect: exploding-gradients-nan
# Clean, finite data; an encoder and a head that are two separate modules; SGD at lr 5 makes the encoder's output
# overflow, so the head's input holds inf/NaN. Review of the watch's texts, row 21b: the head's input, an
# activation, was called a poisoned input batch.
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
X, y = 30 * torch.randn(512, 8), torch.randint(0, 4, (512,))
assert torch.isfinite(X).all()
encoder = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64))
head = nn.Linear(64, 4)
opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=5.0)   # BUG: far too high
for step in range(30):
    xb, yb = X[step * 16 % 512:][:16], y[step * 16 % 512:][:16]
    loss = F.cross_entropy(head(encoder(xb)), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("last loss", loss.item())
