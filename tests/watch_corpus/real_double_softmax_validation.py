# expect: softmax-before-cross-entropy
# source: https://github.com/ariecattan/SciCo/issues/2
# "Validation loss quickly gets stuck around 1.0 ... due to the logits being softmaxed into probabilities before
# being fed into the CrossEntropyLoss": only the validation loss is affected. Adapted: 4 classes.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
criterion = nn.CrossEntropyLoss()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(2):
    model.train()
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = criterion(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        X, y = blobs(seed=1, n=512).tensors
        logits = model(X)
        scores = logits if FIXED else logits.softmax(dim=1)     # BUG: probabilities into CrossEntropyLoss
        val_loss = criterion(scores, y).item()
print(f"symptom shows: {val_loss > 0.74} (validation loss = {val_loss:.3f}; with probabilities it cannot go below "
      f"about 0.74 for 4 classes)")
