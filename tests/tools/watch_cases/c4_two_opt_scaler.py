# clean: torch's AMP example "multiple models, losses and optimizers": one scaler, two scaler.step, one update
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader
from common import blobs, mlp
a = mlp(bn=False); b = mlp(bn=False)
oa = torch.optim.SGD(a.parameters(), 0.05); ob = torch.optim.SGD(b.parameters(), 0.05)
scaler = torch.amp.GradScaler("cpu")
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    oa.zero_grad(); ob.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        l0 = F.cross_entropy(a(X), y); l1 = F.cross_entropy(b(X), y)
    scaler.scale(l0 + l1).backward()
    scaler.step(oa); scaler.step(ob); scaler.update()
print("done")
