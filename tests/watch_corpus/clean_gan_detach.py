# expect: clean
# A small GAN on 2-D points with two optimizers, BatchNorm in the generator: the discriminator's step sees
# fake.detach(); the generator's step goes through the discriminator, whose stale gradients are zeroed before its
# own next step.
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
for step in range(100):
    real = torch.randn(64, 2) * 0.5 + torch.tensor([2.0, -1.0])
    fake = G(torch.randn(64, 4))
    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) + \
        F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
print(f"D loss {d_loss.item():.3f}, G loss {g_loss.item():.3f}, fake mean {fake.mean(0).tolist()}")
