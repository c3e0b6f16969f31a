# expect: running-loss-keeps-graph
# Each loss is backpropagated with retain_graph=True and summed, graph and all, into a running total: the
# retained graphs keep their saved activations (a backward through such a total still works; without
# retain_graph=True it raises). Review of the watch's texts, row 9: it was told each backward had freed them.
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
total = 0
for step in range(10):
    X, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward(retain_graph=True)
    opt.step()
    total = total + loss                                 # BUG: the sum keeps every retained graph
print(f"total {total.item():.3f}")
