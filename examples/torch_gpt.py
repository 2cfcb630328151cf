"""A GPT-2-style decoder in PyTorch for the language-model example and the at-scale benchmarks.

Pre-LayerNorm blocks (LayerNorm before attention and before the MLP, residual around each), causal self-attention
(``scaled_dot_product_attention``), a 4x GELU MLP, learned positions, a final LayerNorm and a head tied to the token
embedding (one matrix, as GPT-2). Initialised as GPT-2: normal(0, 0.02), the residual projections scaled by
1/sqrt(2 x layers). ``fast_examples.lm_data.Size.parameters`` counts exactly this model's parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from fast_examples.lm_data import Size


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, size: Size) -> None:
        super().__init__()
        self.size = size
        self.embed = nn.Embedding(size.vocab, size.width)
        self.position = nn.Embedding(size.context, size.width)
        self.blocks = nn.ModuleList(Block(size.width, size.heads) for _ in range(size.layers))
        self.ln = nn.LayerNorm(size.width)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * size.layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (batch, seq, vocab) of the next token at every position."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.embed.weight.T  # the head tied to the embedding


def build_model(size: Size, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(size)


def lm_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats), computed in float32 whatever the autocast precision."""
    logits = model(inputs)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
