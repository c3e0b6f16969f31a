# expect: out-of-reach no registered pitfall: F.dropout's training= defaults to True, whatever the module's mode
# The intern's second script (learner audit, round 3): F.dropout(x, p=0.5) inside forward, so dropout stays on
# after model.eval(). Outside the catalogue: the watch must exit 0 and say what it looked for, not "clean".
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.dropout(F.relu(self.fc1(x)), p=0.5))  # BUG: training=self.training is missing


torch.manual_seed(0)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
X, y = blobs(seed=1, n=512).tensors
with torch.no_grad():
    print("three evaluations:", [round((model(X).argmax(1) == y).float().mean().item(), 3) for _ in range(3)])
