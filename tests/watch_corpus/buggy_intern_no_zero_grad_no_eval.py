# expect: missing-zero-grad-training eval-without-eval-mode
# The intern's first script (learner audit, round 3): two bugs, no zero_grad() and no model.eval() before the
# no_grad validation loop. The exploding loss is a consequence of the first bug, not a second cause.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
centres = 3 * torch.randn(3, 10)
y_train, y_val = torch.randint(0, 3, (2000,)), torch.randint(0, 3, (500,))
X_train = centres[y_train] + torch.randn(2000, 10)
X_val = centres[y_val] + torch.randn(500, 10)
train_loader = DataLoader(TensorDataset(X_train, y_train), batch_size=32, shuffle=True)
val_loader = DataLoader(TensorDataset(X_val, y_val), batch_size=8)

model = nn.Sequential(
    nn.Linear(10, 64), nn.BatchNorm1d(64), nn.ReLU(),
    nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2),
    nn.Linear(64, 3),
)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

for epoch in range(3):
    model.train()
    total = 0.0
    for X, y in train_loader:
        loss = F.cross_entropy(model(X), y)
        loss.backward()                                         # BUG: no opt.zero_grad()
        opt.step()
        total += loss.item()
    correct = 0
    with torch.no_grad():                                       # BUG: no model.eval() before it
        for X, y in val_loader:
            correct += (model(X).argmax(1) == y).sum().item()
    print(f"epoch {epoch}: training loss {total / len(train_loader):.1f}, validation accuracy {correct / 500:.3f}")
