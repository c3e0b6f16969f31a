# expect: clean
# An evaluation-only script done right: weights loaded into a fresh model, model.eval(), inference_mode, and a
# check that two evaluations of the same weights agree. Nothing trains.
import io

import torch
from torch import nn

from _data import blobs


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))


torch.manual_seed(0)
buffer = io.BytesIO()
torch.save(make_model().state_dict(), buffer)
buffer.seek(0)
model = make_model()
model.load_state_dict(torch.load(buffer))
model.eval()
X, y = blobs(seed=1, n=256).tensors
with torch.inference_mode():
    first = torch.cat([model(xb).argmax(1) for xb in X.split(16)])
    again = torch.cat([model(xb).argmax(1) for xb in X.split(16)])
print(f"accuracy {(first == y).float().mean().item():.3f}, repeatable: {torch.equal(first, again)}")
