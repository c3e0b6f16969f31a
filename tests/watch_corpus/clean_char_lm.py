# expect: clean
# A character-level language model: a GRU reads a text stream in consecutive chunks (not shuffled, by design: the
# hidden state carries over), cross_entropy over the flattened (B * T, vocabulary) logits; early on its loss sits near
# the entropy of the character frequencies, which is learning, not labels that do not belong.
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
words = ["the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran ", "far "]
text = "".join(words[i] for i in torch.randint(0, len(words), (3000,)).tolist())
vocab = sorted(set(text))
data = torch.tensor([vocab.index(c) for c in text])
B, T = 16, 20
stream = data[: len(data) // B * B].view(B, -1)                 # (B, L): 16 parallel streams
embed, gru, head = nn.Embedding(len(vocab), 32), nn.GRU(32, 64, batch_first=True), nn.Linear(64, len(vocab))
params = [*embed.parameters(), *gru.parameters(), *head.parameters()]
opt = torch.optim.Adam(params, lr=3e-3)
h = None
for step, start in enumerate(range(0, stream.shape[1] - T - 1, T)):
    x, target = stream[:, start:start + T], stream[:, start + 1:start + T + 1]
    out, h = gru(embed(x), h)
    loss = F.cross_entropy(head(out).reshape(-1, len(vocab)), target.reshape(-1))
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    h = h.detach()
print(f"{step + 1} steps, loss {loss.item():.3f}, ln(vocabulary) {torch.log(torch.tensor(len(vocab))).item():.3f}")
