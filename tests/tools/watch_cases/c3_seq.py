# clean: a recurrent cell unrolled over 8 time steps, loss summed over time, one backward per batch
import torch, torch.nn.functional as F
from torch import nn
torch.set_num_threads(1); torch.manual_seed(0)
cell = nn.GRUCell(4, 16); head = nn.Linear(16, 3)
opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], 1e-2)
for step in range(40):
    x = torch.randn(8, 32, 4); y = (x[..., 0] > 0).long() + (x[..., 1] > 1).long()
    h = torch.zeros(32, 16); loss = 0
    for t in range(8):
        h = cell(x[t], h)
        loss = loss + F.cross_entropy(head(h), y[t])
    opt.zero_grad(); (loss / 8).backward(); opt.step()
print("last loss", loss.item() / 8)
