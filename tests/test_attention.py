"""Attention against an independent float64 numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import MultiHeadAttention, TransformerConfig, attention_weights, causal_mask, padding_mask, scaled_dot_product_attention


def numpy_attention(q, k, v, mask):
  """softmax(Q K^T / sqrt(d_k)) V in float64; q [B,T,N,H], mask [B,1|N,T,S]."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(mask, logits, -1e30)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum("bnts,bsnh->btnh", w, v)


@pytest.mark.parametrize("d_v", [8, 12])  # 8: fused kernel; 12 (d_k != d_v): einsum path.
def test_attention_matches_float64_reference_with_masks(d_v):
  rng = np.random.default_rng(0)
  b, t, n, d_k = 2, 5, 3, 8
  q = rng.normal(size=(b, t, n, d_k)).astype(np.float32)
  k = rng.normal(size=(b, t, n, d_k)).astype(np.float32)
  v = rng.normal(size=(b, t, n, d_v)).astype(np.float32)
  tokens = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 3, 0]])
  mask = np.asarray(padding_mask(tokens, tokens) & causal_mask(t))
  out = np.asarray(scaled_dot_product_attention(q, k, v, mask))
  ref = numpy_attention(q, k, v, mask)
  real = tokens != 0  # Padding queries' outputs are never used.
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5, rtol=1e-5)


def test_fused_path_equals_plain_einsum():
  rng = np.random.default_rng(1)
  q, k, v = (rng.normal(size=(2, 7, 4, 16)).astype(np.float32) for _ in range(3))
  mask = np.asarray(causal_mask(7))
  fused = scaled_dot_product_attention(q, k, v, mask)
  plain = jnp.einsum("bnts,bsnh->btnh", attention_weights(q, k, mask), v)
  np.testing.assert_allclose(fused, plain, atol=1e-5)


def test_attention_dropout_only_when_not_deterministic():
  rng = np.random.default_rng(2)
  q, k, v = (rng.normal(size=(1, 6, 2, 4)).astype(np.float32) for _ in range(3))
  base = scaled_dot_product_attention(q, k, v)
  same = scaled_dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=None)
  dropped = scaled_dot_product_attention(q, k, v, dropout_rate=0.5,
                                         dropout_rng=jax.random.PRNGKey(0))
  np.testing.assert_allclose(base, same, atol=1e-6)
  assert np.abs(np.asarray(base) - np.asarray(dropped)).max() > 1e-3


def test_multi_head_attention_shapes_and_logical_names():
  cfg = TransformerConfig(vocab_size=10, d_model=24, num_heads=3, d_k=5, d_v=7, d_ff=8,
                          num_layers=1, deterministic=True)
  x = jnp.ones((2, 4, 24))
  variables = MultiHeadAttention(cfg).init(jax.random.PRNGKey(0), x, x)
  params = variables["params"]
  assert params["query"]["kernel"].value.shape == (24, 3, 5)
  assert params["query"]["kernel"].names == ("embed", "heads", "kv")
  assert params["value"]["kernel"].value.shape == (24, 3, 7)
  assert params["out"]["kernel"].value.shape == (3, 7, 24)
  assert params["out"]["kernel"].names == ("heads", "kv", "embed")
  out = MultiHeadAttention(cfg).apply(variables, x, x)
  assert out.shape == (2, 4, 24)


def test_implementation_choice_same_values_and_clear_errors():
  rng = np.random.default_rng(3)
  q, k, v = (rng.normal(size=(2, 6, 2, 8)).astype(np.float32) for _ in range(3))
  mask = np.asarray(causal_mask(6))
  auto = scaled_dot_product_attention(q, k, v, mask, implementation="auto")
  xla = scaled_dot_product_attention(q, k, v, mask, implementation="xla")
  np.testing.assert_array_equal(np.asarray(auto), np.asarray(xla))  # 'auto' on a CPU is XLA.
  with pytest.raises(ValueError, match="must be one of"):
    scaled_dot_product_attention(q, k, v, mask, implementation="flash")
  bf16 = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  if jax.default_backend() == "gpu":  # cuDNN's kernel runs, and agrees with XLA in bf16.
    fused = scaled_dot_product_attention(*bf16, mask, implementation="cudnn")
    plain = scaled_dot_product_attention(*bf16, mask, implementation="xla")
    np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(plain, np.float32),
                               atol=2e-2)
  else:
    with pytest.raises(Exception):  # Asked for explicitly, cuDNN does not fall back.
      scaled_dot_product_attention(*bf16, mask, implementation="cudnn")
  with pytest.raises(ValueError, match="attention_implementation must be"):
    TransformerConfig(attention_implementation="flash")
