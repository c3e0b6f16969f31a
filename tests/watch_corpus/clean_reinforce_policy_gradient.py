# expect: clean
# REINFORCE on a 4-armed bandit: the loss is -log_prob * advantage, negative or positive, and it grows in size as
# the policy gets confident; nothing here is a rising loss to fix.
import torch
from torch import nn

torch.manual_seed(0)
means = torch.tensor([0.1, 0.5, 0.9, 0.3])
policy = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 4))
opt = torch.optim.Adam(policy.parameters(), lr=0.05)
baseline = 0.0
for episode in range(150):
    dist = torch.distributions.Categorical(logits=policy(torch.ones(16, 1)))
    actions = dist.sample()
    rewards = means[actions] + 0.1 * torch.randn(16)
    baseline = 0.9 * baseline + 0.1 * rewards.mean().item()
    loss = -(dist.log_prob(actions) * (rewards - baseline)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"probabilities {policy(torch.ones(1, 1)).softmax(1).squeeze().tolist()}")
