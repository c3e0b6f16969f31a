# expect: running-loss-keeps-graph
# source: https://github.com/google/brax/pull/152 (quoting the PyTorch FAQ, "Don't accumulate history across your
# training loop": total_loss += loss keeps every step's graph; the fix is total_loss += float(loss)).
import gc
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
total_loss = 0
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    total_loss += float(loss) if FIXED else loss                 # BUG: a tensor that links every step's graph
gc.collect()
chain, node = 0, getattr(total_loss, "grad_fn", None)
while node is not None and chain < 10_000:
    chain += 1
    node = next((n for n, _ in node.next_functions if n is not None and "Add" in type(n).__name__), None)
print(f"symptom shows: {chain > 10} ({chain} additions still linked behind total_loss after 32 steps)")
