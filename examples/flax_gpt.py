"""The GPT-2-style decoder of ``fast_examples.torch_gpt`` in Flax (linen): the same blocks, sizes and parameter count.

Pre-LayerNorm blocks, causal self-attention written out (a lower-triangular mask on the scores), a 4x GELU MLP,
learned positions, a final LayerNorm, and the head tied to the token embedding (``Embed.attend``). Weights start
normal(0, 0.02), as GPT-2's.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fast_examples.lm_data import Size

INIT = nn.initializers.normal(0.02)


class Block(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        batch, seq, width = x.shape
        head = width // self.heads
        q, k, v = jnp.split(nn.Dense(3 * width, kernel_init=INIT)(nn.LayerNorm()(x)), 3, axis=-1)
        q, k, v = (t.reshape(batch, seq, self.heads, head) for t in (q, k, v))
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(head)
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(scores.dtype).min), axis=-1)
        attended = jnp.einsum("bhts,bshd->bthd", weights, v).reshape(batch, seq, width)
        x = x + nn.Dense(width, kernel_init=INIT)(attended)
        hidden = nn.gelu(nn.Dense(4 * width, kernel_init=INIT)(nn.LayerNorm()(x)))
        return x + nn.Dense(width, kernel_init=INIT)(hidden)


class GPT(nn.Module):
    size: Size

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed = nn.Embed(self.size.vocab, self.size.width, embedding_init=INIT)
        positions = self.param("position", INIT, (self.size.context, self.size.width))
        x = embed(tokens) + positions[: tokens.shape[1]]
        for _ in range(self.size.layers):
            x = Block(self.size.heads)(x)
        return embed.attend(nn.LayerNorm()(x))  # the head tied to the embedding


def init_params(size: Size, seed: int = 0) -> dict:
    return GPT(size).init(jax.random.PRNGKey(seed), jnp.zeros((1, 8), jnp.int32))["params"]


def lm_loss(size: Size, params: dict, inputs: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy in nats."""
    logits = GPT(size).apply({"params": params}, inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()
