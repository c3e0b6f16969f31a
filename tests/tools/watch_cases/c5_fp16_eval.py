# clean: fp32 training; validation under float16 autocast with no_grad (no backward there)
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader
from common import blobs, mlp
model = mlp(); opt = torch.optim.AdamW(model.parameters(), 1e-2)
loader = DataLoader(blobs(), batch_size=32, shuffle=True)
for epoch in range(3):
    model.train()
    for X, y in loader:
        loss = F.cross_entropy(model(X), y); opt.zero_grad(); loss.backward(); opt.step()
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        acc = sum((model(X).argmax(1) == y).sum().item() for X, y in DataLoader(blobs(seed=1), batch_size=256)) / 1024
    print(epoch, acc)
