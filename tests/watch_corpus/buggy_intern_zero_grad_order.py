# expect: zero-grad-after-backward
# The intern's extra probe (learner audit, round 3): zero_grad() between backward() and step(); the model never
# learns. Every .grad is None at the step: that is what the watch must say, not "shuffled labels".
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
centres = 3 * torch.randn(3, 10)
y_train = torch.randint(0, 3, (2000,))
X_train = centres[y_train] + torch.randn(2000, 10)
model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(3):
    for X, y in DataLoader(TensorDataset(X_train, y_train), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        opt.zero_grad()                                         # BUG: after backward, before step
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
