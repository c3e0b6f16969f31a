# expect: clean
# Stochastic weight averaging: SGD, then an SWALR phase averaging the weights into an AveragedModel, then
# torch.optim.swa_utils.update_bn recomputes the averaged model's BatchNorm statistics (train mode, on purpose).
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
loader = DataLoader(blobs(), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
swa_model, swa_sched = AveragedModel(model), SWALR(opt, swa_lr=0.05)
for epoch in range(4):
    for X, y in loader:
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if epoch >= 2:
        swa_model.update_parameters(model)
        swa_sched.step()
update_bn(loader, swa_model)
swa_model.eval()
X, y = blobs(seed=1, n=256).tensors
with torch.no_grad():
    print(f"SWA accuracy {(swa_model(X).argmax(1) == y).float().mean().item():.3f}")
