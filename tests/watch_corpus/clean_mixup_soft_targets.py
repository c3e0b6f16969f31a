# expect: clean
# Mixup: pairs of examples and their one-hot labels are blended; cross_entropy takes the soft (probability)
# targets directly.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import images

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                      nn.Flatten(), nn.Linear(128, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
beta = torch.distributions.Beta(0.4, 0.4)
for epoch in range(2):
    for X, y in DataLoader(images(), batch_size=32, shuffle=True):
        lam = beta.sample()
        perm = torch.randperm(len(X))
        targets = F.one_hot(y, 4).float()
        X_mix = lam * X + (1 - lam) * X[perm]
        y_mix = lam * targets + (1 - lam) * targets[perm]
        loss = F.cross_entropy(model(X_mix), y_mix)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
