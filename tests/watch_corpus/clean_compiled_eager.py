# expect: clean
# Review K2 w8: torch.compile(model, backend="eager") and 20 AdamW steps, then an evaluation. Under the watch it must
# print exactly what it prints alone: no warning about global module hooks.
import torch
from torch import nn
from torch.nn import functional as F

from _data import blobs

torch.manual_seed(0)
X, y = blobs(n=256).tensors
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
compiled = torch.compile(model, backend="eager")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(20):
    loss = F.cross_entropy(compiled(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
compiled.eval()
with torch.no_grad():
    accuracy = (compiled(X).argmax(1) == y).float().mean().item()
print(f"loss {loss.item():.3f}, accuracy {accuracy:.3f}")
