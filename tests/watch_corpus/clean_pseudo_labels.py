# expect: clean
# Pseudo-labelling (FixMatch-like): every step the model labels a weakly augmented unlabelled batch in train mode
# under no_grad, then trains on a strongly augmented copy with the confident pseudo-labels.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
labelled = DataLoader(blobs(n=256), batch_size=16, shuffle=True)
unlabelled = DataLoader(blobs(n=1024, seed=3), batch_size=64, shuffle=True)
for epoch in range(2):
    for (X, y), (U, _) in zip(labelled, unlabelled):
        with torch.no_grad():
            probs = model(U + 0.05 * torch.randn_like(U)).softmax(1)         # weak augmentation
        confidence, pseudo = probs.max(1)
        mask = (confidence > 0.9).float()
        strong = F.cross_entropy(model(U + 0.5 * torch.randn_like(U)), pseudo, reduction="none")
        loss = F.cross_entropy(model(X), y) + (strong * mask).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
