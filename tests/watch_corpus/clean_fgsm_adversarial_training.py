# expect: clean
# Adversarial training with FGSM: a backward to the input builds the perturbation (the model's gradients are zeroed
# before and after), then the model trains on the perturbed batch.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(2):
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        X = X.clone().requires_grad_(True)
        model.zero_grad()
        F.cross_entropy(model(X), y).backward()
        X_adv = (X + 0.3 * X.grad.sign()).detach()
        loss = F.cross_entropy(model(X_adv), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: adversarial loss {loss.item():.3f}")
