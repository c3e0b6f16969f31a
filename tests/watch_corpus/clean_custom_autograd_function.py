# expect: clean
# A custom torch.autograd.Function (a straight-through sign quantiser) inside a model, trained with SGD.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs


class SignSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sign()

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)            # straight-through inside [-1, 1]


class BinaryNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(SignSTE.apply(self.fc1(x)))


torch.manual_seed(0)
model = BinaryNet()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(2):
    for X, y in DataLoader(blobs(), batch_size=32, shuffle=True):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
