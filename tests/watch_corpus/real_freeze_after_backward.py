# expect: frozen-backbone-still-updated
# source: https://github.com/neuralmagic/sparseml/issues/965
# "TrainableParamsModifier doesn't freeze params ... called for the first time to set requires_grad=False in the
# optimizer.step() call, but at this point it's already late ... autograd ... attached .grad to them".
# Adapted: layers frozen at step 10, after that step's backward, with AdamW.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
for step, (X, y) in enumerate(DataLoader(blobs(), batch_size=32, shuffle=True)):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad(set_to_none=False)
    loss.backward()
    if step == 10:
        model[0].requires_grad_(False)                           # BUG: frozen after backward attached .grad
        frozen = model[0].weight.detach().clone()
        if FIXED:
            for p in model[0].parameters():
                p.grad = None                                    # FIX: nothing for the optimizer to apply
    opt.step()
moved = (model[0].weight - frozen).abs().max().item()
print(f"symptom shows: {moved > 0} (the frozen layer's weights moved by up to {moved:.3g} after freezing)")
