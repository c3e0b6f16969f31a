# expect: eval-without-eval-mode
# Detector variant: a model with Dropout only (no BatchNorm) validated every epoch under no_grad but in train mode.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(3):
    model.train()
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    correct = 0
    with torch.no_grad():                                        # BUG: model.eval() is missing
        for X, y in DataLoader(blobs(seed=1, n=256), batch_size=64):
            correct += (model(X).argmax(1) == y).sum().item()
    print(f"epoch {epoch}: validation accuracy {correct / 256:.3f}")
