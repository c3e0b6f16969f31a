# expect: eval-without-eval-mode
# source: https://github.com/Zhenye-Na/DA-RNN/issues/30
# "no eval() or no_grad() called during testing": the test predictions run in train mode with autograd on.
# Adapted: a model with BatchNorm and Dropout, tested at batch 4 after training.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def test(model, X_test):
    if FIXED:
        model.eval()                                             # FIX: eval mode, and no graph
        with torch.no_grad():
            return torch.cat([model(xb).argmax(1) for xb in X_test.split(4)])
    preds = []
    for xb in X_test.split(4):
        preds.append(model(xb).argmax(1))                        # BUG: train mode, autograd on
    return torch.cat(preds)


X_test, y_test = blobs(seed=1, n=512).tensors
first, again = test(model, X_test), test(model, X_test)
changed = (first != again).float().mean().item()
accuracy = (first == y_test).float().mean().item()
print(f"symptom shows: {changed > 0} (test accuracy {accuracy:.3f}; {changed:.1%} of the predictions change when the "
      f"same weights are tested again)")
