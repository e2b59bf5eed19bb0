"""The Transformer's invariants: positions, causality, padding, packing, caching, size."""

import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer import Transformer, TransformerConfig, count_params, init_cache, sinusoidal_position_encoding
from flax_transformer.network.layers import tied_projection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from configs import big, table3  # noqa: E402

TINY = TransformerConfig(vocab_size=50, d_model=32, d_ff=64, num_heads=4, num_layers=2,
                         max_len=32, deterministic=True)


@pytest.fixture(scope="module", params=["post", "pre"])
def tiny(request):
  cfg = TINY.replace(norm=request.param)
  model = Transformer(cfg)
  src = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 0, 0, 0]], jnp.int32)
  tgt = jnp.array([[12, 13, 14, 0, 0], [15, 16, 17, 18, 0]], jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), src, tgt)["params"]  # Jitted: one compile.
  apply = jax.jit(lambda p, s, t: model.apply({"params": p}, s, t))
  return cfg, model, params, apply, src, tgt


def test_sinusoidal_encoding_matches_formula():
  d_model = 64
  table = sinusoidal_position_encoding(200, d_model)
  for pos in (0, 1, 7, 50, 199):
    for i in (0, 1, 5, 31):
      angle = pos / 10000 ** (2 * i / d_model)
      assert abs(table[pos, 2 * i] - math.sin(angle)) < 1e-6
      assert abs(table[pos, 2 * i + 1] - math.cos(angle)) < 1e-6


def test_causality(tiny):
  _, _, params, apply, src, tgt = tiny
  base = np.asarray(apply(params, src, tgt))
  for t in range(3):
    changed = tgt.at[0, t].set(40)
    out = np.asarray(apply(params, src, changed))
    # Target t is fed at position t + 1 (shifted right): positions <= t must not move.
    np.testing.assert_array_equal(out[0, : t + 1], base[0, : t + 1])
    assert np.abs(out[0, t + 1 :] - base[0, t + 1 :]).max() > 1e-4
    np.testing.assert_array_equal(out[1], base[1])


def test_padding_does_not_change_logits(tiny):
  _, _, params, apply, src, tgt = tiny
  base = np.asarray(apply(params, src, tgt))
  real = np.asarray(tgt != 0)  # Logits at padded targets are never used.
  longer = jnp.pad(src, ((0, 0), (0, 4)))
  np.testing.assert_allclose(np.asarray(apply(params, longer, tgt))[real], base[real], atol=1e-5)
  # Changing a real source token does change them (so the check above can fail).
  assert np.abs(np.asarray(apply(params, src.at[0, 1].set(3), tgt)) - base).max() > 1e-4


def test_packed_row_equals_separate_rows(tiny):
  _, model, params, _, _, _ = tiny
  a_src, a_tgt = [5, 6, 7], [12, 13, 14, 15]
  b_src, b_tgt = [8, 9], [16, 17, 18]
  packed = dict(
      inputs=jnp.array([a_src + b_src + [0]]),
      targets=jnp.array([a_tgt + b_tgt + [0]]),
      inputs_segmentation=jnp.array([[1, 1, 1, 2, 2, 0]]),
      targets_segmentation=jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]]),
      inputs_positions=jnp.array([[0, 1, 2, 0, 1, 0]]),
      targets_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0]]),
  )
  run = jax.jit(lambda inputs, targets, **packing: model.apply(
      {"params": params}, inputs, targets, **packing))  # Not op by op: the suite's time.
  logits = np.asarray(run(**packed))[0]
  alone_a = np.asarray(run(jnp.array([a_src]), jnp.array([a_tgt])))[0]
  alone_b = np.asarray(run(jnp.array([b_src]), jnp.array([b_tgt])))[0]
  np.testing.assert_allclose(logits[:4], alone_a, atol=1e-5)
  np.testing.assert_allclose(logits[4:7], alone_b, atol=1e-5)


def test_tied_projection_gradients_match_autodiff():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 3, 8)).astype(np.float32))
  embedding = jnp.asarray(rng.normal(size=(13, 8)).astype(np.float32))
  weights = jnp.asarray(rng.normal(size=(2, 3, 13)).astype(np.float32))
  ours = lambda x, e: jnp.sum(weights * jnp.sin(tied_projection(x, e)))  # noqa: E731
  plain = lambda x, e: jnp.sum(weights * jnp.sin(x @ e.T))  # noqa: E731
  np.testing.assert_allclose(ours(x, embedding), plain(x, embedding), rtol=1e-6)
  for got, want in zip(jax.grad(ours, (0, 1))(x, embedding), jax.grad(plain, (0, 1))(x, embedding)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_start_from_zero_embedding_never_reads_row_0():
  """start_from_zero_embedding (Marian-NMT, CTranslate2): the decoder starts from the zero
  vector and padding's logit is 0, whatever row 0 holds; no gradient reaches the row; the
  model is the paper's default one with row 0 zeroed; cached decoding agrees."""
  cfg = TINY.replace(start_from_zero_embedding=True)
  model, plain = Transformer(cfg), Transformer(TINY)
  src = jnp.array([[5, 6, 7, 0], [9, 10, 0, 0]], jnp.int32)
  tgt = jnp.array([[12, 13, 14, 0], [15, 16, 17, 18]], jnp.int32)
  # The flag adds no parameter: TINY's, initialised as the `tiny` fixture's post-LN model
  # is (its input shapes: in the suite, that program comes from the compilation cache).
  params = nn.unbox(jax.jit(plain.init)(jax.random.PRNGKey(0), jnp.zeros((2, 6), jnp.int32),
                                        jnp.zeros((2, 5), jnp.int32))["params"])
  with_row = lambda value: {**params, "shared_embedding": {  # noqa: E731
      "embedding": params["shared_embedding"]["embedding"].at[0].set(value)}}
  apply = jax.jit(lambda m, p: m.apply({"params": p}, src, tgt), static_argnums=0)
  real = np.asarray(tgt != 0)  # Logits at padded targets are never used.
  base = np.asarray(apply(model, params))[real]
  np.testing.assert_array_equal(np.asarray(apply(model, with_row(3.0)))[real], base)
  np.testing.assert_array_equal(base[..., 0], 0)
  np.testing.assert_allclose(np.asarray(apply(plain, with_row(0.0)))[real], base, atol=1e-6)
  assert np.abs(np.asarray(apply(plain, with_row(3.0)))[real] - base).max() > 1e-2  # Can fail.
  grads = jax.jit(jax.grad(lambda p: jnp.sum(real[..., None] * jnp.sin(
      model.apply({"params": p}, src, tgt)))))(params)  # Jitted: eager, 10x the time.
  assert not np.any(grads["shared_embedding"]["embedding"][0])
  assert np.all(np.any(grads["shared_embedding"]["embedding"][5:19] != 0, axis=1))

  encoded = jax.jit(lambda p: model.apply({"params": p}, src, method=Transformer.encode))(
      params)
  decoder = Transformer(cfg.replace(decode=True))
  cache = init_cache(cfg, params, encoded, max_decode_len=tgt.shape[1])
  step = jax.jit(lambda cache, previous: decoder.apply(
      {"params": params, "cache": cache}, encoded, src, previous, method=Transformer.decode,
      mutable=["cache"]))
  teacher = np.asarray(apply(model, params))
  previous = jnp.zeros((2, 1), jnp.int32)
  for t in range(tgt.shape[1]):
    logits, cache = step(cache, previous)
    cache, real = cache["cache"], np.asarray(tgt[:, t] != 0)
    np.testing.assert_allclose(np.asarray(logits)[real, 0], teacher[real, t], atol=1e-5)
    previous = tgt[:, t : t + 1]


@pytest.mark.parametrize("share_beam_cache", [True, False])
def test_cached_decoding_reproduces_teacher_forcing(tiny, share_beam_cache):
  cfg, model, params, apply, src, tgt = tiny
  cfg = cfg.replace(share_beam_cache=share_beam_cache)
  teacher = np.asarray(apply(params, src, tgt))
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  decoder = Transformer(cfg.replace(decode=True))
  cache = init_cache(cfg, params, encoded, max_decode_len=tgt.shape[1])

  @jax.jit
  def step(cache, previous):
    logits, updated = decoder.apply({"params": params, "cache": cache}, encoded, src, previous,
                                    method=Transformer.decode, mutable=["cache"])
    return logits[:, 0], updated["cache"]

  previous = jnp.zeros((2, 1), jnp.int32)
  for t in range(tgt.shape[1]):
    logits, cache = step(cache, previous)
    real = np.asarray(tgt[:, t] != 0)
    np.testing.assert_allclose(np.asarray(logits)[real], teacher[real, t], atol=1e-5, rtol=1e-5)
    previous = tgt[:, t : t + 1]


def test_init_cache_holds_what_the_forward_pass_computes(tiny):
  """The cache `init_cache` fills before any step: each decoder layer's encoder-decoder
  keys/values are those the teacher-forced pass attends to (head-major), each output
  kernel's view is that kernel, [d_v, N, D]; self-attention starts empty."""
  cfg, model, params, _, src, tgt = tiny
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  cache = init_cache(cfg, params, encoded, max_decode_len=7, beam_size=3)["decoder"]
  _, state = model.apply({"params": params}, src, tgt, capture_intermediates=True)
  for i in range(cfg.decoder_layers):
    seen = state["intermediates"]["decoder"][f"layer_{i}"]["cross_attention"]
    layer_params = nn.unbox(params)["decoder"][f"layer_{i}"]
    layer = cache[f"layer_{i}"]
    cross = layer["cross_attention"]
    for name in ("key", "value"):
      np.testing.assert_allclose(cross[f"cached_{name}"],
                                 np.asarray(seen[name]["__call__"][0]).transpose(0, 2, 1, 3),
                                 atol=1e-6, rtol=1e-6)
    for block in ("self_attention", "cross_attention"):
      kernel = np.asarray(layer_params[block]["out"]["kernel"])
      view = layer[block]["out"]["kernel_view"]
      np.testing.assert_array_equal(view[0], kernel.transpose(1, 0, 2))
    self_attention = layer["self_attention"]
    assert self_attention["cached_key"].shape == (2, cfg.num_heads, 7 * 3, cfg.head_dim_k)
    assert not np.any(self_attention["cached_key"]) and not np.any(self_attention["cached_value"])


def test_init_cache_called_the_old_way_names_the_new_signature(tiny):
  cfg, _, params, _, _, _ = tiny
  with pytest.raises(TypeError, match=r"encoder output \[B, S, D\] as `encoded`, got int"):
    init_cache(cfg, 2, 16, 5, beam_size=2)  # (config, batch_size, max_decode_len, source_len)


def test_shared_beam_cache_follows_reordered_histories(tiny):
  """Beams reordered arbitrarily (parents repeated or dropped) still see their own history."""
  from flax_transformer.translation.search import _gather_beams
  cfg, model, params, apply, src, _ = tiny
  sentences, beams, length = 2, 3, 5
  decoder = Transformer(cfg.replace(decode=True, share_beam_cache=True))
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  cache = init_cache(cfg, params, encoded, length, beam_size=beams)
  step = jax.jit(lambda cache, ids: decoder.apply(
      {"params": params, "cache": cache}, encoded, src, ids, method=Transformer.decode,
      mutable=["cache"]))
  rng = np.random.default_rng(0)
  fed = np.zeros((sentences * beams, 1), np.int32)  # Row histories; 0 = start token.
  for t in range(length):
    logits, updated = step(cache, jnp.asarray(fed[:, -1:]))
    # Teacher forcing on each row's own history gives the reference.
    targets = np.concatenate([fed[:, 1:], np.ones((len(fed), length - t), np.int32)], axis=1)
    want = apply(params, jnp.repeat(src, beams, axis=0), jnp.asarray(targets))[:, t]
    np.testing.assert_allclose(np.asarray(logits)[:, 0], np.asarray(want), atol=1e-5, rtol=1e-5)
    origin = rng.integers(0, beams, (sentences, beams))
    cache = _gather_beams(updated["cache"], origin, sentences, beams)
    rows = (np.arange(sentences)[:, None] * beams + origin).reshape(-1)
    fed = np.concatenate([fed[rows], rng.integers(2, cfg.vocab_size, (len(fed), 1))], axis=1)
    fed = fed.astype(np.int32)


def test_dropout_only_when_not_deterministic(tiny):
  cfg, _, params, apply, src, tgt = tiny
  train_model = Transformer(cfg.replace(deterministic=False, dropout_rate=0.3))
  run = lambda seed: np.asarray(train_model.apply(  # noqa: E731
      {"params": params}, src, tgt, rngs={"dropout": jax.random.PRNGKey(seed)}))
  assert np.abs(run(1) - run(2)).max() > 1e-3
  np.testing.assert_array_equal(run(1), run(1))
  eval_model = Transformer(cfg.replace(dropout_rate=0.3))  # deterministic=True
  np.testing.assert_allclose(eval_model.apply({"params": params}, src, tgt),
                             apply(params, src, tgt), atol=1e-5)


def test_bfloat16_activations_close_to_float32(tiny):
  cfg, _, params, apply, src, tgt = tiny
  bf16 = Transformer(cfg.replace(dtype="bfloat16"))
  low = np.asarray(bf16.apply({"params": params}, src, tgt))
  high = np.asarray(apply(params, src, tgt))
  assert low.dtype == np.float32 and np.isfinite(low).all()
  real = np.asarray(tgt != 0)
  scale = np.abs(high[real]).max()
  assert np.abs(low[real] - high[real]).max() < 0.05 * scale
  assert (low[real].argmax(-1) == high[real].argmax(-1)).mean() > 0.8


def test_learned_positions_and_unshared_embeddings_are_what_the_model_uses():
  """Table 3 (E): a learned [max_len, d_model] table added at each position; untied:
  separate source and target embeddings and an output projection of their own."""
  from flax import traverse_util

  cfg = TINY.replace(positional="learned", share_embeddings=False)
  src = jnp.array([[5, 6, 7, 8, 1]], jnp.int32)
  tgt = jnp.array([[9, 10, 11, 1]], jnp.int32)
  model = Transformer(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), src, tgt)["params"])
  assert params["encoder"]["position"]["position_embedding"].shape == (32, 32)
  _, state = model.apply({"params": params}, src, tgt, capture_intermediates=True,
                         mutable=["intermediates"])
  out = {"/".join(k[:-1]): np.asarray(v[0]) for k, v in
         traverse_util.flatten_dict(state["intermediates"]).items() if k[-1] == "__call__"}
  for side, ids, table in (("encoder", src, "source_embedding"),
                           ("decoder", np.pad(tgt[:, :-1], ((0, 0), (1, 0))), "target_embedding")):
    expected = (np.asarray(params[table]["embedding"])[np.asarray(ids)] * np.sqrt(cfg.d_model)
                + np.asarray(params[side]["position"]["position_embedding"])[:ids.shape[1]])
    np.testing.assert_allclose(out[f"{side}/position"], expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out["decoder"], out["decoder/layer_1"] @ np.asarray(
      params["decoder"]["logits"]["kernel"]), rtol=1e-4, atol=1e-4)
  # The learned table is trained: changing one position's row changes the output there.
  moved = jax.tree_util.tree_map(lambda x: x, params)
  moved["decoder"]["position"]["position_embedding"] = params["decoder"]["position"][
      "position_embedding"].at[2].add(1.0)
  before = np.asarray(model.apply({"params": params}, src, tgt))
  after = np.asarray(model.apply({"params": moved}, src, tgt))
  assert np.abs(after[0, 2] - before[0, 2]).max() > 1e-3
  np.testing.assert_array_equal(after[0, :2], before[0, :2])  # Causal: earlier ones stay.


def test_every_parameter_has_logical_axis_names(tiny):
  _, _, params, _, _, _ = tiny
  leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
  assert all(len(x.names) == x.value.ndim for x in leaves)


PAPER_PARAMS_M = {  # Table 3, millions, shared 37k vocabulary.
    "base": 65, "B16": 58, "B32": 60, "C2": 36, "C4": 50, "C8": 80, "C256": 28,
    "C1024": 168, "Cff1024": 53, "Cff4096": 90,
}


def params_of(model_cfg: TransformerConfig) -> int:
  x = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(model_cfg).init(jax.random.PRNGKey(0), x, x))
  return count_params(shapes["params"])


def exact_params(cfg: TransformerConfig) -> int:
  """The paper's architecture counted by hand: one shared V x d_model embedding, per
  attention W^Q, W^K (d_model x h d_k), W^V (d_model x h d_v), W^O (h d_v x d_model)
  without biases, the FFN's two matrices with biases, and a LayerNorm (scale, bias) per
  sub-layer: two per encoder layer, three per decoder layer."""
  d, h = cfg.d_model, cfg.num_heads
  attention = d * h * (2 * cfg.head_dim_k + cfg.head_dim_v) + h * cfg.head_dim_v * d
  ffn = 2 * d * cfg.d_ff + cfg.d_ff + d
  norm = 2 * d
  return (cfg.vocab_size * d + cfg.encoder_layers * (attention + ffn + 2 * norm)
          + cfg.decoder_layers * (2 * attention + ffn + 3 * norm))


def test_base_parameter_count_from_real_initialisation():
  cfg = TransformerConfig.from_dict(table3.get_config("base").model.to_dict())
  x = jnp.ones((1, 8), jnp.int32)
  real = Transformer(cfg).init(jax.random.PRNGKey(0), x, x)["params"]
  assert count_params(real) == params_of(cfg) == exact_params(cfg)


@pytest.mark.parametrize("row", sorted(PAPER_PARAMS_M))
def test_table3_parameter_counts(row):
  """Exactly the formula; the paper's figure (millions, one significant place for most
  rows) within 7%: Table 3 does not say how it counted the vocabulary (its ~37k BPE
  size is rounded), which moves a base-size count by up to ~1M."""
  cfg = TransformerConfig.from_dict(table3.get_config(row).model.to_dict())
  assert cfg.vocab_size == 37000
  assert params_of(cfg) == exact_params(cfg)
  assert abs(params_of(cfg) / (PAPER_PARAMS_M[row] * 1e6) - 1) < 0.07


def test_big_parameter_count():
  cfg = TransformerConfig.from_dict(big.get_config().model.to_dict())
  assert (cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.dropout_rate) == (1024, 4096, 16, 0.3)
  assert params_of(cfg) == exact_params(cfg)
  assert abs(params_of(cfg) / 213e6 - 1) < 0.02


def test_dropout_mask_rate_and_scaling():
  from flax_transformer.network.layers import Dropout, dropout_keep_mask

  keep = np.asarray(dropout_keep_mask(jax.random.PRNGKey(0), (64, 64, 257), 0.1))
  assert keep.shape == (64, 64, 257)
  assert abs(keep.mean() - 0.9) < 0.003
  # Both 16-bit halves of each word are used and independent-looking.
  assert abs(keep[..., :129].mean() - keep[..., 129:].mean()) < 0.01
  x = jnp.ones((8, 16, 32))
  out = np.asarray(Dropout(0.25, deterministic=False).apply(
      {}, x, rngs={"dropout": jax.random.PRNGKey(1)}))
  np.testing.assert_allclose(np.unique(out), [0.0, 1 / 0.75], rtol=1e-6)
  np.testing.assert_array_equal(Dropout(0.25, deterministic=True).apply({}, x), x)
  # The backward pass drops the same positions and scales the survivors alike.
  w = jax.random.normal(jax.random.PRNGKey(2), x.shape)
  grad = jax.grad(lambda x: jnp.sum(w * Dropout(0.25, deterministic=False).apply(
      {}, x, rngs={"dropout": jax.random.PRNGKey(1)})))(x)
  np.testing.assert_allclose(grad, w * out, rtol=1e-6)
