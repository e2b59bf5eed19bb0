"""Scaled dot-product and multi-head attention (paper section 3.2).

Shapes: B batch, T query length, S key/value length, N heads (`num_heads`),
H per-head width (`d_k` for queries/keys, `d_v` for values).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.network.config import TransformerConfig

# Logical axis names of parameters and activations; `sharding` maps them to a mesh.
Q_KERNEL_AXES = ("embed", "heads", "kv")
OUT_KERNEL_AXES = ("heads", "kv", "embed")


def padding_mask(query_tokens: jax.Array, key_tokens: jax.Array) -> jax.Array:
  """[B, T], [B, S] token ids -> bool [B, 1, T, S]: both positions are real (id != 0)."""
  return (query_tokens[:, None, :, None] != 0) & (key_tokens[:, None, None, :] != 0)


def causal_mask(length: int) -> jax.Array:
  """bool [1, 1, T, T]: query t may see keys 0..t (no illegal leftward flow)."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
  """[B, T], [B, S] packed-sequence ids -> bool [B, 1, T, S]: same sequence only."""
  return query_segments[:, None, :, None] == key_segments[:, None, None, :]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
  """Logical AND of the masks that are not None (None when all are)."""
  present = [m for m in masks if m is not None]
  if not present:
    return None
  out = present[0]
  for m in present[1:]:
    out = out & m
  return out


def attention_weights(query: jax.Array, key: jax.Array,
                      mask: jax.Array | None = None) -> jax.Array:
  """softmax(Q K^T / sqrt(d_k)) -> [B, N, T, S], in float32.

  query [B, T, N, d_k], key [B, S, N, d_k], mask bool broadcastable to
  [B, N, T, S] (True = may attend). Illegal connections get a large negative
  logit, so a fully masked row (a padding query) stays finite.
  """
  return _head_major_weights(to_head_major(query), to_head_major(key), mask)


def to_head_major(x: jax.Array) -> jax.Array:
  """[B, T, N, H] <-> [B, N, T, H]."""
  return x.transpose(0, 2, 1, 3)


def _head_major_weights(query, key, mask):
  """query [B, N, T, d_k], key [B, N, S, d_k] -> float32 weights [B, N, T, S]."""
  d_k = query.shape[-1]
  logits = jnp.einsum("bnth,bnsh->bnts", query, key,
                      preferred_element_type=jnp.float32) / np.sqrt(d_k).astype(np.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


def cached_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                     mask: jax.Array | None = None) -> jax.Array:
  """Attention of a few new queries over a head-major key/value cache.

  query [B, T, N, d_k], key [B, N, S, d_k], value [B, N, S, d_v], mask
  broadcastable to [B, N, T, S]; returns [B, T, N, d_v]. The cache stays
  head-major so every decoding step reads it in place instead of transposing
  every cached tensor (what XLA did with a [B, S, N, H] cache).
  """
  weights = _head_major_weights(to_head_major(query), key, mask)
  return to_head_major(jnp.einsum("bnts,bnsh->bnth", weights.astype(value.dtype), value))


ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")
_FUSED_DTYPES = (jnp.bfloat16, jnp.float16)  # cuDNN's fused attention takes no float32.
_reported: set[str] = set()


def _report_once(message: str) -> None:
  """Which attention ran, logged once per process and kind (at trace time)."""
  if message not in _reported:
    _reported.add(message)
    logging.info("Attention: %s", message)


def scaled_dot_product_attention(
    query: jax.Array, key: jax.Array, value: jax.Array,
    mask: jax.Array | None = None, *, dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None, implementation: str = "auto",
) -> jax.Array:
  """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (paper eq. 1).

  query [B, T, N, d_k], key [B, S, N, d_k], value [B, S, N, d_v],
  mask bool broadcastable to [B, N, T, S]; returns [B, T, N, d_v].
  implementation: 'cudnn' is cuDNN's fused (flash) kernel, GPU only, bf16/fp16;
  'xla' the plain path; 'auto' takes cuDNN on a GPU for bf16/fp16 and falls back
  to XLA where cuDNN refuses the shapes. Attention dropout, and d_k != d_v,
  always take the unfused path (the fused kernels lack them). The log says
  which ran.
  """
  if implementation not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f"attention implementation must be one of {ATTENTION_IMPLEMENTATIONS}, "
                     f"got {implementation!r}")
  use_dropout = dropout_rng is not None and dropout_rate > 0.0
  if not use_dropout and key.shape == value.shape:
    if implementation == "cudnn" or (implementation == "auto" and jax.default_backend() == "gpu"
                                     and query.dtype in _FUSED_DTYPES):
      try:
        out = jax.nn.dot_product_attention(query, key, value, mask=mask,
                                           implementation="cudnn")
      except (NotImplementedError, ValueError, RuntimeError) as e:
        if implementation == "cudnn":
          raise
        _report_once(f"XLA (cuDNN fused attention refused {query.dtype.name} "
                     f"{tuple(query.shape)}: {e})")
      else:
        _report_once("cuDNN fused kernel (jax.nn.dot_product_attention, implementation='cudnn')")
        return out
    else:
      _report_once(f"XLA (jax.nn.dot_product_attention, implementation='xla'; "
                   f"{jax.default_backend()}, {query.dtype.name})")
    return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")
  _report_once("XLA, unfused (attention dropout or d_k != d_v)")
  weights = attention_weights(query, key, mask)
  if use_dropout:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  return jnp.einsum("bnts,bsnh->btnh", weights.astype(value.dtype), value)


class HeadsProjection(nn.Module):
  """x [..., D] -> [..., num_heads, head_dim]: the W_i^Q, W_i^K or W_i^V of every head."""

  num_heads: int
  head_dim: int
  use_bias: bool = False  # The paper's W^Q, W^K, W^V have none.
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    # Declared with its full [D, N, H] shape (not flattened), so the logical
    # names always match the array they describe.
    kernel = self.param(
        "kernel", nn.with_logical_partitioning(
            nn.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2)), Q_KERNEL_AXES),
        (x.shape[-1], self.num_heads, self.head_dim), self.param_dtype)
    return _with_bias(self, "...d,dnh->...nh", x, kernel,
                      (self.num_heads, self.head_dim), ("heads", "kv"))


class OutputProjection(nn.Module):
  """Concat(head_1..head_h) W^O: [..., num_heads, d_v] -> [..., features].

  cached: decoding. The kernel [N, d_v, D] is read as its [1, d_v, N, D] view,
  made once when the cache is created (`init_cache`) and kept in the 'cache'
  collection; the parameter tree is unchanged. Read from the parameters, XLA
  transposed the kernel to that layout inside the search loop at every step
  (its loop-invariant code motion leaves transposes be). Contracted over
  (d_v, N), head-minor, the order in which `jnp.einsum` contracts (n, h) here,
  the sums are the uncached path's, bit for bit. Kept 3-D, N keeps its mesh
  axis: tensor parallelism neither gathers nor replicates the view. Its leading
  1 keeps a search from taking it for a per-row state (only a one-row search
  could, and reordering one row is the identity).
  """

  features: int
  use_bias: bool = False  # The paper's W^O has none.
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  cached: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    heads, head_dim = x.shape[-2:]
    kernel = self.param(
        "kernel", nn.with_logical_partitioning(
            nn.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2), OUT_KERNEL_AXES),
        (heads, head_dim, self.features), self.param_dtype)
    if not self.cached:
      return _with_bias(self, "...nh,nhd->...d", x, kernel, (self.features,), ("embed",))
    view = self.variable("cache", "kernel_view", lambda: jnp.asarray(kernel, self.dtype).transpose(
        1, 0, 2)[None]).value  # [1, d_v, N, D]: N keeps its mesh axis (tensor parallelism).
    return _with_bias(self, "...hn,hnd->...d", x.swapaxes(-1, -2), view[0], (self.features,),
                      ("embed",))


def _with_bias(module: nn.Module, spec: str, x: jax.Array, kernel: jax.Array,
               bias_shape: tuple[int, ...], bias_axes: tuple[str, ...]) -> jax.Array:
  """einsum(spec, x, kernel) in the module's dtype, plus a zero-initialised bias
  of `bias_shape` when `module.use_bias`."""
  if not module.use_bias:
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=module.dtype)
    return jnp.einsum(spec, x, kernel)
  bias = module.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, bias_axes),
                      bias_shape, module.param_dtype)
  x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=module.dtype)
  return jnp.einsum(spec, x, kernel) + bias


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (paper section 3.2.2).

  Attributes:
    config: the model's hyper-parameters (`num_heads`, `d_k`, `d_v`, `d_model`).
    decode: cache keys/values and attend one new query per call (decoder
      self-attention during incremental decoding).
    static_kv: `inputs_kv` is the same at every decoding step (encoder-decoder
      attention during incremental decoding): its keys/values are projected
      when the cache is created (`init_cache`) and read from it afterwards.

  `inputs_kv` may hold one row per sentence while `inputs_q` holds k adjacent
  rows per sentence (the beams of a beam search): each sentence's k queries
  then attend to its one key/value row, so beams share it instead of copying it.
  """

  config: TransformerConfig
  decode: bool = False
  static_kv: bool = False

  @nn.compact
  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array,
               mask: jax.Array | None = None, beams: int = 1) -> jax.Array:
    """inputs_q [B*k, T, d_model], inputs_kv [B, S, d_model] -> [B*k, T, d_model].

    mask: bool broadcastable to [B, N, k*T, S] (k = 1 unless beams share keys).
    beams: with `decode`, the k adjacent rows of `inputs_q` that share one
    self-attention cache row (a sentence's beams); `mask` then has shape
    [B, 1, k, k*L] and says which beam slot holds each position of each
    beam's history (see `Decoder`).
    """
    cfg = self.config
    n, d_k, d_v = cfg.num_heads, cfg.head_dim_k, cfg.head_dim_v

    def project(x: jax.Array, features: int, name: str) -> jax.Array:
      out = HeadsProjection(n, features, use_bias=cfg.attention_bias, dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, name=name)(x)
      return nn.with_logical_constraint(out, ("batch", "length", "heads", "kv"))

    query = project(inputs_q, d_k, "query")
    if self.decode or self.static_kv:
      if self.static_kv:
        key, value = self._static_key_value(inputs_kv, project)
      else:
        key, value, mask = self._update_cache(project(inputs_kv, d_k, "key"),
                                              project(inputs_kv, d_v, "value"), mask, beams)
      rows, length = query.shape[:2]
      sentences = key.shape[0]
      if rows % sentences:
        raise ValueError(f"{rows} query rows do not divide into {sentences} key/value rows")
      # A sentence's adjacent beams become extra query positions of its one row.
      x = cached_attention(query.reshape(sentences, rows // sentences * length, n, d_k),
                           key, value, mask)
      x = x.reshape(rows, length, n, d_v)
    else:
      key, value = project(inputs_kv, d_k, "key"), project(inputs_kv, d_v, "value")
      dropout_rng = None
      if not cfg.deterministic and cfg.attention_dropout_rate > 0.0:
        dropout_rng = self.make_rng("dropout")
      if self.is_mutable_collection("intermediates"):
        # Only when asked (attention plots): the fused kernel never forms weights.
        self.sow("intermediates", "attention_weights", attention_weights(query, key, mask))
      x = scaled_dot_product_attention(query, key, value, mask,
                                       dropout_rate=cfg.attention_dropout_rate,
                                       dropout_rng=dropout_rng,
                                       implementation=cfg.attention_implementation)
    out = OutputProjection(cfg.d_model, use_bias=cfg.attention_bias, dtype=cfg.dtype,
                           param_dtype=cfg.param_dtype, cached=self.decode or self.static_kv,
                           name="out")(x)
    return nn.with_logical_constraint(out, ("batch", "length", "embed"))

  def _static_key_value(self, inputs_kv, project):
    """Keys/values of `inputs_kv`, head-major: projected when the cache is created
    (`init_cache`, from the encoder output), read from it at every step after.

    Projected per step they would cost as much as the rest of the step (S source
    positions per query). Filled before the search loop, the loop body reads them
    in place: no conditional (which on a GPU reads its predicate on the host) and
    no copies of the cache through its branches.
    """
    cfg = self.config
    if not self.has_variable("cache", "cached_key"):  # Creating the cache.
      key = to_head_major(project(inputs_kv, cfg.head_dim_k, "key"))
      value = to_head_major(project(inputs_kv, cfg.head_dim_v, "value"))
      self.put_variable("cache", "cached_key", key)
      self.put_variable("cache", "cached_value", value)
      return key, value
    return self.get_variable("cache", "cached_key"), self.get_variable("cache", "cached_value")

  def _update_cache(self, key, value, mask, beams):
    """Writes this step's key/value at the cache index; masks unwritten positions.

    key/value [R, T, N, H] with R = G * beams rows -> cached keys/values
    [G, N, L * beams, H], position-major (entry p * beams + s: position p as
    written by beam slot s) and the mask. Each row writes only to its own slot,
    so a search never reorders these tensors: a beam that takes over another's
    history reads it where it was written, as `mask` directs. One step's
    entries are contiguous, so the write is one in-place slice update. On the
    first (initialising) call the cache takes the full target length L from
    `key` and the call attends as usual; afterwards each call brings one
    position (T = 1).
    """
    key, value = to_head_major(key), to_head_major(value)
    rows, heads, length, _ = key.shape
    if rows % beams:
      raise ValueError(f"{rows} decoder rows do not divide into groups of {beams} beams")
    groups = rows // beams

    def cache_shape(x):
      return (groups, heads, length * beams, x.shape[-1])

    def by_slot(x):  # [G*k, N, 1, H] -> [G, N, k, H]
      return x.reshape(groups, beams, heads, x.shape[-1]).transpose(0, 2, 1, 3)

    initialised = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, cache_shape(key), key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, cache_shape(value),
                                 value.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialised:
      return key, value, mask
    if length != 1:
      raise ValueError(f"decode=True takes one target position per call, got {length}")
    i = index.value
    cached_key.value = jax.lax.dynamic_update_slice_in_dim(cached_key.value, by_slot(key),
                                                           i * beams, axis=2)
    cached_value.value = jax.lax.dynamic_update_slice_in_dim(cached_value.value,
                                                             by_slot(value), i * beams, axis=2)
    index.value = i + 1
    max_len = cached_key.value.shape[2] // beams
    # Positions not yet written are never visible, whatever `mask` says.
    written = jnp.repeat(jnp.arange(max_len) <= i, beams)[None, None, None, :]
    return cached_key.value, cached_value.value, combine_masks(mask, written)
