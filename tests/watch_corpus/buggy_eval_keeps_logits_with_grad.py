# expect: eval-without-no-grad
# Detector variant: evaluation in eval mode without no_grad, keeping every batch's logits for a confusion matrix.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import images

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                      nn.Flatten(), nn.Linear(16 * 144, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for X, y in DataLoader(images(), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
logits = [model(X) for X, _ in DataLoader(images(seed=1, n=256), batch_size=32)]   # BUG: graphs kept
print("predicted class counts:", torch.cat(logits).argmax(1).bincount(minlength=4).tolist())
