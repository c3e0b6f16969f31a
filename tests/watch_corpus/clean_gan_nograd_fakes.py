# expect: clean
# A GAN whose discriminator step draws its fakes under no_grad with the generator in train mode (BatchNorm), and
# whose generator step draws new ones: the no_grad pass is part of every training iteration, not an evaluation.
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
for step in range(80):
    real = torch.randn(64, 2) * 0.5 + 1.0
    with torch.no_grad():
        fake = G(torch.randn(64, 4))
    d_loss = F.softplus(-D(real)).mean() + F.softplus(D(fake)).mean()
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    g_loss = F.softplus(-D(G(torch.randn(64, 4)))).mean()
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
print(f"D loss {d_loss.item():.3f}, G loss {g_loss.item():.3f}")
