# expect: eval-without-eval-mode
# An evaluation-only script: weights loaded from a checkpoint into a fresh model (which starts in train mode) and
# evaluated under no_grad without model.eval(). No optimizer steps at all while it runs.
import io

import torch
from torch import nn

from _data import blobs


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))


torch.manual_seed(0)
trained = make_model().eval()
trained[1].running_mean.normal_()                              # stands in for statistics learned in training
buffer = io.BytesIO()
torch.save(trained.state_dict(), buffer)
buffer.seek(0)

model = make_model()
model.load_state_dict(torch.load(buffer))                       # BUG: a fresh nn.Module is in train mode
X, y = blobs(seed=1, n=256).tensors
with torch.no_grad():
    accuracy = sum((model(xb).argmax(1) == yb).sum().item() for xb, yb in zip(X.split(16), y.split(16))) / 256
print(f"accuracy {accuracy:.3f}")
