# expect: clean
# Older-style code: gradients reset by hand (through .data, in place, set to None, or with torch._foreach_zero_)
# instead of zero_grad().
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(4):
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        for p in model.parameters():
            if p.grad is not None:
                if epoch == 0:
                    p.grad.data.zero_()
                elif epoch == 1:
                    p.grad.detach_()
                    p.grad.zero_()
                elif epoch == 2:
                    p.grad = None
        if epoch == 3:
            torch._foreach_zero_([p.grad for p in model.parameters() if p.grad is not None])
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
