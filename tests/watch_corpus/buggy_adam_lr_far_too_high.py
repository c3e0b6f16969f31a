# expect: learning-rate-too-high
# Detector variant: Adam at lr 10 on a small classifier: the loss jumps by orders of magnitude and stays up, in finite
# numbers.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=10.0)             # BUG: about 10,000x a usual Adam rate
for X, y in DataLoader(blobs(spread=1.0), batch_size=32, shuffle=True):     # overlapping classes
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3g}")
