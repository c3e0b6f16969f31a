# expect: softmax-before-cross-entropy
# Detector variant: the model ends in nn.Softmax and its output goes to nn.CrossEntropyLoss.
import torch
from torch import nn
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4), nn.Softmax(dim=1))   # BUG: softmax layer
criterion = nn.CrossEntropyLoss()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    loss = criterion(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")
