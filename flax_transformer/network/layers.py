"""Building blocks of the Transformer: embeddings, positions, FFN, encoder/decoder layers.

Shapes: B batch, T length, D `d_model`, F `d_ff`, V `vocab_size`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.network.activations import ACTIVATIONS
from flax_transformer.network.attention import MultiHeadAttention
from flax_transformer.network.config import TransformerConfig


def sinusoidal_position_encoding(max_len: int, d_model: int, *, layout: str = "interleaved",
                                 frequencies: str = "paper") -> np.ndarray:
  """float32 [max_len, d_model] table (paper section 3.5).

  PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same angle).
  layout 'halves' puts the sines in columns [0, d_model/2) and the cosines after
  them; frequencies 'fairseq' uses pos / 10000^(i/(d_model/2 - 1)) (see TransformerConfig).
  """
  pos = np.arange(max_len, dtype=np.float64)[:, None]
  # fairseq's float32 arithmetic. transformers' tables come from torch's float32 exp, at
  # times an ulp from numpy's: row r then differs by up to r ulps of the angle (6.1e-5 at
  # row 710 of a 1026 x 1024 table; within 7.6e-6 at 130 rows).
  if frequencies == "fairseq":
    half = d_model // 2
    step = np.float32(np.log(10000.0) / (half - 1))
    inverse = np.exp(np.arange(half, dtype=np.float32) * -step)
    angle = (pos.astype(np.float32) * inverse[None, :]).astype(np.float64)
  else:
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, two_i / d_model)
  table = np.zeros((max_len, d_model), dtype=np.float64)
  if layout == "halves":
    table[:, :d_model // 2] = np.sin(angle)
    table[:, d_model // 2:] = np.cos(angle)
    return table.astype(np.float32)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle[:, : d_model // 2])
  return table.astype(np.float32)


class PositionEncoding(nn.Module):
  """Adds position information to embeddings: sinusoidal (paper) or learned (Table 3 E)."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    """x [B, T, D], positions int [B, T] (index within each packed sequence) -> [B, T, D]."""
    cfg = self.config
    rows = cfg.max_len + cfg.position_offset
    if cfg.positional == "learned":
      table = self.param(
          "position_embedding",
          nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, "embed")),
          (rows, cfg.d_model), cfg.param_dtype)
    else:
      table = jnp.asarray(sinusoidal_position_encoding(
          rows, cfg.d_model, layout=cfg.position_layout, frequencies=cfg.position_frequencies))
    if cfg.position_offset:
      positions = positions + cfg.position_offset
    return x + jnp.take(table, positions, axis=0).astype(x.dtype)


class Embedding(nn.Module):
  """Token embedding scaled by sqrt(d_model) (unless not `scale_embedding`); `attend` is
  the tied pre-softmax projection. vocab_size: rows (None: the config's `vocab_size`)."""

  config: TransformerConfig
  vocab_size: int | None = None

  def setup(self):
    cfg = self.config
    # Init std d_model^-0.5, so scaled embeddings start with unit variance.
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=cfg.d_model ** -0.5),
                                     ("vocab", "embed")),
        (self.vocab_size or cfg.vocab_size, cfg.d_model), cfg.param_dtype)

  def __call__(self, ids: jax.Array) -> jax.Array:
    """ids int [B, T] -> [B, T, D] = E[ids] * sqrt(d_model)."""
    cfg = self.config
    x = jnp.take(jnp.asarray(self.embedding, cfg.dtype), ids, axis=0)
    if not cfg.scale_embedding:
      return x
    return x * jnp.asarray(np.sqrt(cfg.d_model), cfg.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    """x [B, T, D] -> logits [B, T, V] = x E^T."""
    return tied_projection(x, jnp.asarray(self.embedding, self.config.dtype))


@jax.custom_vjp
def tied_projection(x: jax.Array, embedding: jax.Array) -> jax.Array:
  """x [..., D], embedding E [V, D] -> logits [..., V] = x E^T (the tied pre-softmax layer)."""
  return jnp.einsum("...d,vd->...v", x, embedding)


def _tied_projection_fwd(x, embedding):
  return tied_projection(x, embedding), (x, embedding)


def _tied_projection_bwd(residuals, g):
  # The same gradients autodiff gives, as plain 2-D matmuls: for the einsum,
  # XLA's CPU backend wrote the [tokens, V] gradient out transposed (one strided
  # copy, the largest single op in the small bench step's profile).
  x, embedding = residuals
  x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
  return (g2 @ embedding).reshape(x.shape), (x2.T @ g2).T


tied_projection.defvjp(_tied_projection_fwd, _tied_projection_bwd)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (paper eq. 2; another `activation` in place of
  max(0, .)): [B, T, D] -> [B, T, D]."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.config
    h = nn.Dense(cfg.d_ff, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                 kernel_init=nn.with_logical_partitioning(
                     nn.initializers.xavier_uniform(), ("embed", "mlp")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
                 name="w1")(x)
    h = ACTIVATIONS[cfg.activation].fn(h)
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    out = nn.Dense(cfg.d_model, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                   kernel_init=nn.with_logical_partitioning(
                       nn.initializers.xavier_uniform(), ("mlp", "embed")),
                   bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                   name="w2")(h)
    return nn.with_logical_constraint(out, ("batch", "length", "embed"))


def dropout_keep_mask(rng: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """bool mask, True with probability 1 - rate (to within 2^-16).

  Each random 32-bit word serves two elements (its two 16-bit halves): random
  bits dominate the cost of dropout on CPUs, so this halves it. The halves sit
  side by side on the last axis, so a batch-sharded mask needs no communication.
  """
  half = -(-shape[-1] // 2)
  words = jax.random.bits(rng, shape[:-1] + (half,), jnp.uint32)
  halves = jnp.concatenate([words & 0xFFFF, words >> 16], axis=-1)[..., :shape[-1]]
  return halves >= jnp.uint32(round(rate * 65536))


class Dropout(nn.Module):
  """Inverted dropout: zero with probability `rate`, scale the rest by 1 / (1 - rate)."""

  rate: float
  deterministic: bool

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.deterministic or self.rate == 0.0:
      return x
    keep = dropout_keep_mask(self.make_rng("dropout"), x.shape, self.rate)
    # A multiply by a constant 0 or 1/(1 - rate) array, not a select on `keep`:
    # the backward pass is then `g * scale`, which XLA transposes cheaply for
    # the next weight gradient; the select's backward was fused with the mask's
    # bit unpacking into slow transposed copies (BENCHMARKS.md).
    scale = jnp.where(keep, jnp.asarray(1.0 / (1.0 - self.rate), x.dtype),
                      jnp.zeros((), x.dtype))
    return x * jax.lax.stop_gradient(scale)


def layer_norm(config: TransformerConfig, name: str | None = None) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=config.layer_norm_epsilon, dtype=config.dtype,
                      param_dtype=config.param_dtype,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                      name=name)


class SubLayer(nn.Module):
  """Residual connection around `sublayer`, with dropout and layer normalisation.

  'post' (paper): LayerNorm(x + Dropout(Sublayer(x))).
  'pre': x + Dropout(Sublayer(LayerNorm(x))).
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array, sublayer: Callable[[jax.Array], jax.Array]) -> jax.Array:
    cfg = self.config
    dropout = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)
    if cfg.norm == "pre":
      return x + dropout(sublayer(layer_norm(cfg, "norm")(x)))
    return layer_norm(cfg, "norm")(x + dropout(sublayer(x)))


class EncoderLayer(nn.Module):
  """Self-attention then FFN, each wrapped in a `SubLayer`: [B, S, D] -> [B, S, D]."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None) -> jax.Array:
    cfg = self.config
    attention = MultiHeadAttention(cfg, name="self_attention")
    x = SubLayer(cfg, name="attention_block")(x, lambda h: attention(h, h, mask))
    return SubLayer(cfg, name="ffn_block")(x, FeedForward(cfg, name="ffn"))


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention, FFN: [B, T, D] -> [B, T, D]."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, y: jax.Array, encoded: jax.Array, self_mask: jax.Array | None,
               cross_mask: jax.Array | None, beams: int = 1) -> jax.Array:
    """beams: with `decode`, adjacent rows of `y` sharing one cache row (see Decoder)."""
    cfg = self.config
    self_attention = MultiHeadAttention(cfg, decode=cfg.decode, name="self_attention")
    cross_attention = MultiHeadAttention(
        cfg, static_kv=cfg.decode and cfg.share_beam_cache, name="cross_attention")
    y = SubLayer(cfg, name="self_attention_block")(
        y, lambda h: self_attention(h, h, self_mask, beams))
    # Queries from the decoder; keys and values from the encoder's last layer.
    y = SubLayer(cfg, name="cross_attention_block")(
        y, lambda h: cross_attention(h, encoded, cross_mask))
    return SubLayer(cfg, name="ffn_block")(y, FeedForward(cfg, name="ffn"))
