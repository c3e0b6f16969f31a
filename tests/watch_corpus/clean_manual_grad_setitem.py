# expect: clean
# Gradients reset by hand with an assignment, `p.grad[:] = 0`, before every backward (review of the watch's texts,
# row 2: it was read as gradients piling up). Each step's .grad is that batch's gradient alone (checked below).
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
params = list(model.parameters())
opt = torch.optim.SGD(params, lr=0.05)
worst = 0.0
for step in range(30):
    X, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    for p in params:
        if p.grad is not None:
            p.grad[:] = 0
    loss = F.cross_entropy(model(X), y)
    fresh = torch.autograd.grad(loss, params, retain_graph=True)
    loss.backward()
    worst = max(worst, max((p.grad - f).abs().max().item() for p, f in zip(params, fresh)))
    opt.step()
assert worst == 0.0
print("each step's .grad is its batch's gradient alone")
