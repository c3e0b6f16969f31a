# clean: activation checkpointing of a block with BatchNorm and Dropout (as in chapter 5's memory section)
import sys, torch, torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential
from torch.utils.data import DataLoader
from common import blobs
reentrant = sys.argv[1] == "reentrant"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.AdamW(model.parameters(), 1e-2)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    X.requires_grad_(True)
    out = checkpoint_sequential(model, 2, X, use_reentrant=reentrant)
    loss = F.cross_entropy(out, y); opt.zero_grad(); loss.backward(); opt.step()
print("done")
