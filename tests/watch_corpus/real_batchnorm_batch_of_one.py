# expect: script-fails (exit 2: the script raises ValueError on its own; the watch reports it and its traceback)
# source: https://discuss.pytorch.org/t/error-expected-more-than-1-value-per-channel-when-training/26274
# "ValueError: Expected more than 1 value per channel when training": the last batch of an epoch holds one sample.
# The bug is loud (an exception), so the watch's job is only to report that the script failed.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for X, y in DataLoader(blobs(n=97), batch_size=32, shuffle=True, drop_last=FIXED):   # BUG: 97 = 3 * 32 + 1
    loss = F.cross_entropy(model(X), y)                          # raises on the last batch, of one sample
    opt.zero_grad()
    loss.backward()
    opt.step()
print("symptom shows: False (training ran to the end)")
