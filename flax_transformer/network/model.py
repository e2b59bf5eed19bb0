"""The encoder-decoder Transformer (paper section 3.1, Figure 1).

Token id 0 is padding. Shapes: B batch, S source length, T target length,
D `d_model`, V `vocab_size`. Packed rows carry `*_segmentation` (which
sequence a token belongs to, 0 = padding) and `*_positions` (index within it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.network.attention import (causal_mask, combine_masks, padding_mask,
                                        segment_mask)
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.layers import (DecoderLayer, Dropout, Embedding, EncoderLayer,
                                     PositionEncoding, layer_norm)


def shift_right(targets: jax.Array, segmentation: jax.Array | None = None) -> jax.Array:
  """[B, T] -> [B, T] decoder inputs: 0 (start token) then targets[:, :-1].

  With packing, every sequence's first position also gets the start token.
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segmentation is not None:
    previous = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segmentation == previous, shifted, 0)
  return shifted


def default_positions(tokens: jax.Array) -> jax.Array:
  return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


class Encoder(nn.Module):
  """Embedding, positions, dropout, `encoder_layers` x EncoderLayer: [B, S] -> [B, S, D]."""

  config: TransformerConfig
  embedding: nn.Module

  @nn.compact
  def __call__(self, inputs, inputs_positions=None, inputs_segmentation=None):
    cfg = self.config
    if inputs_positions is None:
      inputs_positions = default_positions(inputs)
    mask = padding_mask(inputs, inputs)
    if inputs_segmentation is not None:
      mask = combine_masks(mask, segment_mask(inputs_segmentation, inputs_segmentation))
    x = PositionEncoding(cfg, name="position")(self.embedding(inputs), inputs_positions)
    x = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)(x)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    for i in range(cfg.encoder_layers):
      x = EncoderLayer(cfg, name=f"layer_{i}")(x, mask)
    if cfg.norm == "pre":
      x = layer_norm(cfg, "final_norm")(x)
    return x


class Decoder(nn.Module):
  """Shifted targets -> logits [B, T, V], attending to the encoder output."""

  config: TransformerConfig
  embedding: nn.Module  # Also the pre-softmax projection when shared.

  def _decode_step_inputs(self, inputs, targets):
    """Decoding: (decoder inputs, positions, self mask, cross mask, beams per sentence)
    of one position per row, with the cache's step and beam slots advanced."""
    # One position per call; the caller feeds the previous output token.
    decoder_inputs = targets
    rows = targets.shape[0]
    if rows % inputs.shape[0]:
      raise ValueError(f"{rows} target rows do not divide into {inputs.shape[0]} sources")
    # k target rows per source row: a sentence's beams, sharing its cache rows.
    beams = rows // inputs.shape[0]
    initialised = self.has_variable("cache", "decode_step")
    step = self.variable("cache", "decode_step", lambda: jnp.array(0, jnp.int32))
    # Which beam slot of its sentence holds each position of a row's history
    # (-1: not yet written). Per row, so a search reorders it with the beams;
    # the keys/values it points into stay where they were written.
    slots = self.variable("cache", "beam_slots", jnp.full, targets.shape, -1, jnp.int32)
    self_mask = None
    if initialised:
      positions = jnp.full(targets.shape, step.value, jnp.int32)
      own_slot = (jnp.arange(rows, dtype=jnp.int32) % beams)[:, None]
      slots.value = jax.lax.dynamic_update_slice_in_dim(slots.value, own_slot, step.value,
                                                        axis=1)
      step.value = step.value + 1
      history = slots.value.reshape(rows // beams, 1, beams, -1, 1)
      # [sentences, 1, beams (queries), L * beams (keys, position-major)].
      self_mask = (history == jnp.arange(beams)).reshape(rows // beams, 1, beams, -1)
    else:  # Creating the cache from a full-length target shape.
      positions = default_positions(targets)
    cross_mask = (inputs != 0)[:, None, None, :]
    return decoder_inputs, positions, self_mask, cross_mask, beams

  @nn.compact
  def __call__(self, encoded, inputs, targets, targets_positions=None,
               inputs_segmentation=None, targets_segmentation=None):
    cfg = self.config
    beams = 1
    if cfg.decode:
      decoder_inputs, positions, self_mask, cross_mask, beams = self._decode_step_inputs(inputs, targets)
    else:
      decoder_inputs = shift_right(targets, targets_segmentation)
      positions = default_positions(targets) if targets_positions is None else targets_positions
      # Shifted inputs hold a 0 start token, so padding comes from `targets`.
      self_mask = combine_masks(padding_mask(targets, targets), causal_mask(targets.shape[1]))
      cross_mask = padding_mask(targets, inputs)
      if targets_segmentation is not None:
        self_mask = combine_masks(
            self_mask, segment_mask(targets_segmentation, targets_segmentation))
      if targets_segmentation is not None and inputs_segmentation is not None:
        cross_mask = combine_masks(
            cross_mask, segment_mask(targets_segmentation, inputs_segmentation))

    if cfg.decoder_start_id:  # The shifted-in 0s (pads after a target's end are masked).
      decoder_inputs = jnp.where(decoder_inputs == 0, cfg.decoder_start_id, decoder_inputs)
    embedded = self.embedding(decoder_inputs)
    if cfg.start_from_zero_embedding:  # Row 0 is zeros: no gradient reaches it.
      embedded = jnp.where((decoder_inputs == 0)[..., None], 0, embedded)
    y = PositionEncoding(cfg, name="position")(embedded, positions)
    y = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)(y)
    y = nn.with_logical_constraint(y, ("batch", "length", "embed"))
    for i in range(cfg.decoder_layers):
      y = DecoderLayer(cfg, name=f"layer_{i}")(y, encoded, self_mask, cross_mask, beams)
    if cfg.norm == "pre":
      y = layer_norm(cfg, "final_norm")(y)

    if cfg.share_embeddings:
      logits = self.embedding.attend(y)
    elif cfg.tie_target_embedding:
      logits = self.embedding.attend(y)
    else:
      logits = nn.Dense(
          cfg.vocab_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype, use_bias=False,
          kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(),
                                                   ("embed", "vocab")),
          name="logits")(y)
    if cfg.start_from_zero_embedding:  # Padding's row of the pre-softmax matrix is zeros.
      logits = jnp.where(jnp.arange(logits.shape[-1]) == 0, 0, logits)
    if cfg.final_logits_bias:
      bias = self.param("final_logits_bias",
                        nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                        (cfg.vocab_size,), cfg.param_dtype)
      logits = logits + jnp.asarray(bias, logits.dtype)
    if cfg.vocab_padding:  # Rows added for sharding: never produced (config.vocab_padding).
      real = jnp.arange(logits.shape[-1]) < cfg.vocab_size - cfg.vocab_padding
      logits = jnp.where(real, logits, -jnp.inf)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    return logits.astype(jnp.float32)


class Transformer(nn.Module):
  """Encoder-decoder Transformer.

  `__call__(inputs [B, S], targets [B, T]) -> logits [B, T, V]` with teacher
  forcing (targets are shifted right inside). For inference, `encode` once, then
  `decode` with `config.decode=True` one position at a time using the 'cache'
  collection (see `init_cache`).
  """

  config: TransformerConfig

  def setup(self):
    cfg = self.config
    if cfg.share_embeddings:
      source_embedding = target_embedding = Embedding(cfg, name="shared_embedding")
    else:
      source_embedding = Embedding(cfg, cfg.source_vocab, name="source_embedding")
      target_embedding = Embedding(cfg, name="target_embedding")
    self.encoder = Encoder(cfg, embedding=source_embedding)
    self.decoder = Decoder(cfg, embedding=target_embedding)

  def encode(self, inputs, inputs_positions=None, inputs_segmentation=None):
    """inputs int [B, S] -> encoded [B, S, D]."""
    return self.encoder(inputs, inputs_positions, inputs_segmentation)

  def decode(self, encoded, inputs, targets, targets_positions=None,
             inputs_segmentation=None, targets_segmentation=None):
    """encoded [B, S, D], inputs [B, S], targets [B, T] -> logits float32 [B, T, V].

    With `config.decode`, `targets` is [B, 1]: the token emitted at the previous
    step (0 at the first), and the cache advances by one position.
    """
    return self.decoder(encoded, inputs, targets, targets_positions,
                        inputs_segmentation, targets_segmentation)

  def __call__(self, inputs, targets, inputs_positions=None, targets_positions=None,
               inputs_segmentation=None, targets_segmentation=None):
    """inputs [B, S], targets [B, T] -> logits float32 [B, T, V]."""
    encoded = self.encode(inputs, inputs_positions, inputs_segmentation)
    return self.decode(encoded, inputs, targets, targets_positions,
                       inputs_segmentation, targets_segmentation)


def init_cache(config: TransformerConfig, params, encoded: jax.Array, max_decode_len: int,
               beam_size: int = 1) -> dict:
  """The decoding cache of `encoded` [B, S, D] (the encoder output, one row per
  sentence) for B x `beam_size` rows, before the first step.

  Self-attention keys/values (zeroed) hold up to `max_decode_len` target positions
  per row. What every step reads unchanged is made here, once, outside any search
  loop: each attention's output kernel in the layout a step consumes, and with
  `config.share_beam_cache` the encoder-decoder keys/values of `encoded`; a
  sentence's beams then share its cache rows (those keys/values, and
  self-attention slots that a search never reorders), and `Transformer.decode`
  takes `encoded`/`inputs` with one row per sentence. The cache holds what it read
  of `params` (the kernels' views): decode with the same `params`, and build a new
  cache for others (an ensemble member, parameters trained further).
  """
  if not hasattr(encoded, "shape") or len(encoded.shape) != 3:
    # Until 2026-11-28 (2025e0f): init_cache(config, batch_size, max_decode_len, source_len).
    raise TypeError("init_cache(config, params, encoded, max_decode_len, beam_size=1) takes the "
                    f"encoder output [B, S, D] as `encoded`, got {type(encoded).__name__}")
  return _init_cache(config.replace(decode=True, deterministic=True), params, encoded,
                     max_decode_len, beam_size)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _init_cache(config, params, encoded, max_decode_len, beam_size):
  # The initialising call of `decode` on a full-length target creates the cache
  # (positions it runs the decoder over are dead code: only the cache is kept).
  batch, source_len = encoded.shape[:2]
  if not config.share_beam_cache:
    encoded = jnp.repeat(encoded, beam_size, axis=0)
  _, variables = Transformer(config).apply(
      {"params": params}, encoded, jnp.ones(encoded.shape[:2], jnp.int32),
      jnp.ones((batch * beam_size, max_decode_len), jnp.int32), method=Transformer.decode,
      mutable=["cache"])
  return variables["cache"]


def abstract_params(model_config: TransformerConfig):
  """Shapes and dtypes of the model's parameters (nothing allocated)."""
  dummy = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(model_config).init(
      jax.random.PRNGKey(0), dummy, dummy)["params"])
  return nn.unbox(shapes)


def count_params(params) -> int:
  """Number of scalars in a parameter tree (boxed or not)."""
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(nn.unbox(params))))
