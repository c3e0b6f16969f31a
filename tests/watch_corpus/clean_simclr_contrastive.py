# expect: clean
# SimCLR-style contrastive loss: the labels are arange(B) (each view's positive is its pair), with a running loss
# kept as a float and a linear probe trained afterwards on detached features.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 16))
opt = torch.optim.Adam(encoder.parameters(), lr=1e-2)
running = 0.0
for X, _ in DataLoader(blobs(), batch_size=32, shuffle=True):
    z1 = F.normalize(encoder(X + 0.3 * torch.randn_like(X)), dim=1)
    z2 = F.normalize(encoder(X + 0.3 * torch.randn_like(X)), dim=1)
    logits = z1 @ z2.T / 0.2                                     # (B, B)
    loss = F.cross_entropy(logits, torch.arange(len(X)))
    opt.zero_grad()
    loss.backward()
    opt.step()
    running += loss.item()
encoder.eval()
X, y = blobs(seed=1, n=512).tensors
with torch.no_grad():
    feats = encoder(X)
probe = nn.Linear(16, 4)
popt = torch.optim.Adam(probe.parameters(), lr=1e-2)
for _ in range(50):
    ploss = F.cross_entropy(probe(feats), y)
    popt.zero_grad()
    ploss.backward()
    popt.step()
print(f"contrastive loss {running / 32:.3f}, probe loss {ploss.item():.3f}")
