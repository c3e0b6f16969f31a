# expect: missing-zero-grad-training
# Review K2 w4: no zero_grad(), and the gradients are clipped before every step. The clip writes into .grad in
# place, which must not look like a reset.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(blobs(n=1920), batch_size=32, shuffle=True)
for X, y in loader:                                             # 60 steps
    loss = F.cross_entropy(model(X), y)
    loss.backward()                                             # BUG: no opt.zero_grad() anywhere
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
print(f"last loss {loss.item():.3f}")
