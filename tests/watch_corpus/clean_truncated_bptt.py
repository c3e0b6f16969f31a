# expect: clean
# Truncated backpropagation through time: an LSTM reads long sequences in chunks of 10 steps, the hidden state is
# carried across chunks and detached at each boundary; gradients are clipped.
import torch
from torch import nn
from torch.nn import functional as F

from _data import sequences

torch.manual_seed(0)
data = sequences(n=64, length=81)                         # (64, 81, 1)
lstm, head = nn.LSTM(1, 32, batch_first=True), nn.Linear(32, 1)
params = list(lstm.parameters()) + list(head.parameters())
opt = torch.optim.Adam(params, lr=1e-2)
for epoch in range(3):
    state = None
    for start in range(0, 80, 10):
        x, target = data[:, start:start + 10], data[:, start + 1:start + 11]
        out, state = lstm(x, state)
        loss = F.mse_loss(head(out), target)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        state = tuple(s.detach() for s in state)
    print(f"epoch {epoch}: loss {loss.item():.4f}")
