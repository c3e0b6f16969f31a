# expect: clean
# WGAN-GP: five critic steps per generator step, a gradient penalty through torch.autograd.grad(create_graph=True);
# the critic's loss is negative and moves a lot, which is what it should do.
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
C = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
opt_c = torch.optim.Adam(C.parameters(), lr=1e-3, betas=(0.5, 0.9))
for it in range(25):
    for _ in range(5):
        real = torch.randn(64, 2) * 0.3 + 2.0
        fake = G(torch.randn(64, 4)).detach()
        alpha = torch.rand(64, 1)
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        grad, = torch.autograd.grad(C(mixed).sum(), mixed, create_graph=True)
        penalty = ((grad.norm(dim=1) - 1) ** 2).mean()
        c_loss = C(fake).mean() - C(real).mean() + 10 * penalty
        opt_c.zero_grad()
        c_loss.backward()
        opt_c.step()
    g_loss = -C(G(torch.randn(64, 4))).mean()
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
print(f"critic loss {c_loss.item():.3f}, generator loss {g_loss.item():.3f}")
