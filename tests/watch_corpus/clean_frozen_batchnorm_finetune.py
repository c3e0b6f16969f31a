# expect: clean
# Fine-tuning with a frozen backbone: requires_grad_(False) and eval() on the backbone after every model.train(), so
# its BatchNorm statistics stay as they were; only the new head is in the optimizer.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU())
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.backbone(x))


torch.manual_seed(0)
model = Net()
model.backbone.requires_grad_(False)
model.head = nn.Linear(64, 4)
opt = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
for epoch in range(3):
    model.train()
    model.backbone.eval()                                # frozen on purpose: statistics and weights
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
