# clean: gradient accumulation by summing the micro-batch losses, one backward per step; eval with no_grad
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader
from common import blobs, mlp
model = mlp(); opt = torch.optim.AdamW(model.parameters(), 1e-2)
loader = DataLoader(blobs(), batch_size=16, shuffle=True)
K = 4
for epoch in range(2):
    model.train()
    micro = []
    for X, y in loader:
        micro.append((X, y))
        if len(micro) < K: continue
        total = 0
        for Xm, ym in micro:
            total = total + F.cross_entropy(model(Xm), ym) / K
        opt.zero_grad(); total.backward(); opt.step(); micro = []
    model.eval()
    with torch.no_grad():
        acc = sum((model(X).argmax(1) == y).sum().item() for X, y in DataLoader(blobs(seed=1), batch_size=64)) / 1024
    print("epoch", epoch, "acc", acc)
