# expect: softmax-before-cross-entropy
# source: https://github.com/jindongwang/Deep-learning-activity-recognition/issues/10
# "when you use nn.CrossEntropyLoss() it automatically applies softmax ... you input vector in softmax layer and
# then you apply it to nn.CrossEntropyLoss()". Adapted: a 1-D CNN for activity windows, 6 classes; the logged loss
# cannot fall below log(1 + 5/e) = 1.00, whatever the model learns.
import sys

import torch
from torch import nn
from torch.nn import functional as F

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
y = torch.randint(0, 6, (768,))
X = torch.randn(768, 3, 32) + F.one_hot(y, 6).float()[:, :3, None] * 1.5 - F.one_hot(y, 6).float()[:, 3:, None]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(3, 16, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten())
        self.fc = nn.Linear(16, 6)

    def forward(self, x):
        out = self.fc(self.conv(x))
        return out if FIXED else F.softmax(out, dim=1)           # BUG: softmax, then CrossEntropyLoss


model, criterion = Net(), nn.CrossEntropyLoss()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for epoch in range(3):
    for xb, yb in zip(X.split(32), y.split(32)):
        loss = criterion(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
floor = torch.log(torch.tensor(1 + 5 / torch.e)).item()         # the least CrossEntropyLoss of probabilities, 6 classes
print(f"symptom shows: {loss.item() >= floor} (the training loss of the last batch = {loss.item():.3f}; fed "
      f"probabilities it cannot go below {floor:.3f})")
