# expect: clean
# An encoder and a head as two separate modules trained by one optimizer; the head is called on the encoder's
# output, so there are two root forwards per step; evaluation in eval mode under inference_mode.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU())
head = nn.Sequential(nn.Dropout(0.2), nn.Linear(64, 4))
opt = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=1e-2)
for epoch in range(2):
    encoder.train(), head.train()
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(head(encoder(X)), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    encoder.eval(), head.eval()
    X, y = blobs(seed=1, n=256).tensors
    with torch.inference_mode():
        print(f"epoch {epoch}: accuracy {(head(encoder(X)).argmax(1) == y).float().mean().item():.3f}")
