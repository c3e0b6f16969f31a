# expect: running-loss-keeps-graph
# source: https://github.com/samuelyu2002/ImVisible/issues/2
# "Try changing all of the places with += loss into += loss.item() ... The problem might be because the
# computational graphs were also being stored, taking up large amounts of RAM." Adapted: the validation loop sums
# its losses as tensors (outside no_grad), so every batch's activations stay alive.
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import images

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                      nn.Linear(256, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for X, y in DataLoader(images(), batch_size=32, shuffle=True):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
val_running_loss = 0.0
for X, y in DataLoader(images(seed=1, n=256), batch_size=32):
    loss = F.cross_entropy(model(X), y)
    val_running_loss += loss.item() if FIXED else loss           # BUG: keeps each batch's graph
seen, todo, convs = set(), [getattr(val_running_loss, "grad_fn", None)], 0
while todo:                                                      # the graphs still reachable from the total
    node = todo.pop()
    if node is None or node in seen:
        continue
    seen.add(node)
    convs += type(node).__name__ == "ConvolutionBackward0"
    todo += [n for n, _ in node.next_functions]
print(f"symptom shows: {convs > 1} ({convs} batches' convolution graphs, each holding its saved input, still reachable "
      f"from val_running_loss after the loop)")
