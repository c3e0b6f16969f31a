# expect: clean
# Triplet-loss fine-tuning with the embedding net in eval mode on purpose (its BatchNorm statistics frozen, as when
# fine-tuning a pretrained backbone): three forward passes, then one backward through all three (review of the
# watch's texts, row 7: it was read as an evaluation that keeps its graphs).
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16))
net.eval()                                               # BatchNorm statistics frozen on purpose
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for step in range(20):
    anchor, noise, negative = torch.randn(16, 8), torch.randn(16, 8), torch.randn(16, 8)
    loss = F.triplet_margin_loss(net(anchor), net(anchor + 0.1 * noise), net(negative))
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"triplet loss {loss.item():.3f}")
