# expect: clean
# An exponential moving average of the weights (torch.optim.swa_utils.AveragedModel with an EMA function), updated
# after every step and evaluated in eval mode under no_grad: the EMA copy is never stepped by an optimizer.
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99), use_buffers=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for epoch in range(2):
    model.train()
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update_parameters(model)
    ema.eval()
    X, y = blobs(seed=1, n=256).tensors
    with torch.no_grad():
        print(f"epoch {epoch}: EMA accuracy {(ema(X).argmax(1) == y).float().mean().item():.3f}")
