# expect: softmax-before-cross-entropy
# Detector variant: probabilities "made safe" with + 1e-8 before cross_entropy, so the loss's input was not made by
# softmax itself; its rows are still probabilities (non-negative, summing to 1).
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    probs = torch.softmax(model(X), dim=1)
    loss = F.cross_entropy(probs + 1e-8, y)                     # BUG: probabilities, not logits
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"last loss {loss.item():.3f}")
