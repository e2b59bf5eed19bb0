"""The paper's details, each checked against values computed here from the parameters
(numpy, the paper's formulas), so that a change to any of them fails a test:
the sqrt(d_model) embedding scale, the sinusoidal positions, dropout on the
embedding + position sums, the post-LN order LayerNorm(x + Dropout(Sublayer(x))),
projections without biases, exact weight tying, and beam search's early stop."""

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import Transformer, TransformerConfig
from flax_transformer.network.model import count_params
from flax_transformer.translation import search

INPUTS = np.array([[3, 4, 5, 6, 7, 8, 1, 0], [9, 10, 11, 1, 0, 0, 0, 0]], np.int32)
TARGETS = np.array([[12, 13, 14, 15, 1, 0, 0, 0], [16, 17, 1, 0, 0, 0, 0, 0]], np.int32)


def small(**changes) -> TransformerConfig:
  return TransformerConfig(**{**dict(vocab_size=40, d_model=16, d_ff=32, num_heads=4,
                                     num_layers=2, max_len=32), **changes})


def run(cfg: TransformerConfig, dropout_seed: int = 1):
  """Params and every module's captured output, path -> array, for INPUTS/TARGETS."""
  model = Transformer(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), INPUTS, TARGETS))["params"]
  _, state = model.apply({"params": params}, INPUTS, TARGETS, capture_intermediates=True,
                         mutable=["intermediates"],
                         rngs={"dropout": jax.random.PRNGKey(dropout_seed)})
  captured = {"/".join(k[:-1]) if k[-1] == "__call__" else "/".join(k): np.asarray(v[0])
              for k, v in flax.traverse_util.flatten_dict(state["intermediates"]).items()}
  return params, captured


def paper_position_encoding(length: int, d_model: int) -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (section 3.5)."""
  pe = np.zeros((length, d_model))
  for pos in range(length):
    for i in range(0, d_model, 2):
      pe[pos, i] = np.sin(pos / 10000 ** (i / d_model))
      pe[pos, i + 1] = np.cos(pos / 10000 ** (i / d_model))
  return pe


def layer_norm(x, norm_params, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(norm_params["scale"]) + np.asarray(
      norm_params["bias"])


def test_embeddings_are_scaled_by_sqrt_d_model_and_summed_with_sinusoids():
  cfg = small(deterministic=True)
  params, out = run(cfg)
  table = np.asarray(params["shared_embedding"]["embedding"])
  positions = np.arange(INPUTS.shape[1])
  expected = table[INPUTS] * np.sqrt(cfg.d_model) + paper_position_encoding(
      INPUTS.shape[1], cfg.d_model)[positions]
  np.testing.assert_allclose(out["encoder/position"], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_dropout_is_applied_to_the_embedding_plus_position_sums(side):
  rate = 0.5
  params, out = run(small(dropout_rate=rate))
  summed, dropped = out[f"{side}/position"], out[f"{side}/Dropout_0"]
  zero = dropped == 0
  assert 0.4 < zero.mean() < 0.6  # The rate, on the sums' every element.
  np.testing.assert_allclose(dropped[~zero], summed[~zero] / (1 - rate), rtol=1e-6)
  # The first layer reads the dropped-out sums: its query projection is theirs.
  kernel = np.asarray(params[side]["layer_0"]["self_attention"]["query"]["kernel"])
  np.testing.assert_allclose(out[f"{side}/layer_0/self_attention/query"],
                             np.einsum("btd,dnh->btnh", dropped, kernel), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("deterministic", [True, False], ids=["eval", "train"])
def test_every_sublayer_is_layer_norm_of_x_plus_dropout_of_sublayer_x(deterministic):
  rate = 0.0 if deterministic else 0.3
  params, out = run(small(deterministic=deterministic, dropout_rate=rate))
  blocks = {"encoder": [("attention_block", "self_attention"), ("ffn_block", "ffn")],
            "decoder": [("self_attention_block", "self_attention"),
                        ("cross_attention_block", "cross_attention"), ("ffn_block", "ffn")]}
  for side, chain in blocks.items():
    x = out[f"{side}/Dropout_0"]  # The layer stack's input.
    for layer in range(2):
      prefix = f"{side}/layer_{layer}"
      for block, sublayer in chain:
        sub = out[f"{prefix}/{sublayer}"]
        dropped = out[f"{prefix}/{block}/Dropout_0"] if not deterministic else sub
        if not deterministic:  # Dropout(Sublayer(x)): zeros, or the sublayer's output scaled.
          kept = dropped != 0
          np.testing.assert_allclose(dropped[kept], sub[kept] / (1 - rate), rtol=1e-5)
        expected = layer_norm(x + dropped, params[side][f"layer_{layer}"][block]["norm"])
        np.testing.assert_allclose(out[f"{prefix}/{block}"], expected, rtol=1e-4, atol=1e-4)
        x = out[f"{prefix}/{block}"]
      np.testing.assert_allclose(out[prefix], x, rtol=1e-6)


def test_parameter_count_is_the_papers_formula_exactly():
  """Shared embedding (one V x d_model matrix), bias-free W^Q W^K W^V W^O, FFN with
  biases, two (encoder) or three (decoder) LayerNorms per layer, nothing else."""
  for cfg in (small(), small(num_layers=1, num_decoder_layers=3, d_ff=24)):
    d, d_ff, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    attention = 4 * d * d
    ffn = 2 * d * d_ff + d_ff + d
    norms = 2 * d
    expected = (v * d + cfg.encoder_layers * (attention + ffn + 2 * norms)
                + cfg.decoder_layers * (2 * attention + ffn + 3 * norms))
    params, _ = run(cfg.replace(deterministic=True))
    assert count_params(params) == expected
    with_bias, _ = run(cfg.replace(deterministic=True, attention_bias=True))
    biases = (cfg.encoder_layers + 2 * cfg.decoder_layers) * 4 * d
    assert count_params(with_bias) == expected + biases


def test_weight_tying_is_exact_one_matrix_for_both_embeddings_and_the_softmax():
  cfg = small(deterministic=True)
  params, out = run(cfg)
  shaped = [p for p in jax.tree_util.tree_leaves(params) if p.shape == (cfg.vocab_size,
                                                                          cfg.d_model)]
  assert len(shaped) == 1
  table = np.asarray(params["shared_embedding"]["embedding"])
  # Pre-softmax: logits = decoder output E^T, no bias.
  hidden = out["decoder/layer_1"]
  np.testing.assert_allclose(out["decoder"], hidden @ table.T, rtol=1e-4, atol=1e-4)
  # Decoder inputs read the same matrix (shifted targets: BOS 0, then the targets).
  shifted = np.concatenate([np.zeros_like(TARGETS[:, :1]), TARGETS[:, :-1]], axis=1)
  np.testing.assert_allclose(
      out["decoder/position"],
      table[shifted] * np.sqrt(cfg.d_model) + paper_position_encoding(
          TARGETS.shape[1], cfg.d_model)[None], rtol=1e-5, atol=1e-5)


# --- Beam search's early stop ---------------------------------------------------------


def reference_beam_search(log_prob_table, beam_size, max_len, alpha, eos_id, stop=None):
  """Plain-Python beam search over a first-order Markov model (previous token -> log
  probs), as search.beam_search describes it. `stop`: None runs all max_len steps;
  'paper' stops once no live beam, penalised at max_len (its best case), beats the
  K-th finished; 'naive' penalises at the current length instead (too early).
  Returns (finished [(score, tokens)] best first, steps taken)."""
  lp = lambda n: ((5 + n) / 6) ** alpha  # noqa: E731
  alive, finished = [(0.0, (0,))], []  # (log P, tokens after the start token 0)
  for step in range(max_len):
    if stop and len(finished) == beam_size and alive:
      if alive[0][0] / lp(max_len if stop == "paper" else max(step, 1)) <= finished[-1][0]:
        return finished, step
    candidates = []
    for log_p, seq in alive:
      for token, token_lp in enumerate(log_prob_table[seq[-1]]):
        if token == search.PAD_ID or (step + 1 >= max_len and token != eos_id):
          continue
        candidates.append((log_p + token_lp, seq + (token,)))
    candidates.sort(key=lambda c: -c[0])
    top = candidates[:2 * beam_size]
    for log_p, seq in top:
      if seq[-1] == eos_id:
        finished.append((log_p / lp(step + 1), seq))
    finished = sorted(finished, key=lambda c: -c[0])[:beam_size]
    alive = [c for c in top if c[1][-1] != eos_id][:beam_size]
  return finished, max_len


@pytest.mark.parametrize("alpha,seed", [(0.6, 0), (0.6, 1), (0.6, 2), (2.0, 0), (2.0, 1)])
def test_beam_search_stops_early_only_when_no_live_beam_can_win(alpha, seed):
  """Ground truth: the same search run to the maximum length. EOS is likely here, so
  hypotheses finish early. With alpha 0.6 the search prunes and stops long before
  max_len; with alpha 2.0 long outputs can still win, and a stop that penalised live
  beams at their current length would have returned a different answer."""
  vocab, beam, max_len, eos = 12, 3, 40, 1
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(vocab, vocab)) * 2.0
  logits[:, eos] += 2.5
  table = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)), np.float64)

  full, _ = reference_beam_search(table, beam, max_len, alpha, eos)
  stopped, steps = reference_beam_search(table, beam, max_len, alpha, eos, stop="paper")
  assert [s for _, s in stopped] == [s for _, s in full]
  if alpha < 1:
    assert steps < max_len // 2, "the scenario must exercise the early stop"
  else:
    naive, _ = reference_beam_search(table, beam, max_len, alpha, eos, stop="naive")
    assert [s for _, s in naive] != [s for _, s in full], "the scenario must tell them apart"

  calls = []  # One model call per search step, counted on the host.

  def tokens_to_logits(ids, cache):
    jax.debug.callback(lambda: calls.append(1))
    return jnp.asarray(logits, jnp.float32)[ids[:, 0]], cache

  result = jax.jit(lambda: search.beam_search(
      tokens_to_logits, jnp.zeros((beam,)), batch_size=1, beam_size=beam,
      max_decode_len=max_len, alpha=alpha, eos_id=eos))()
  jax.effects_barrier()
  assert len(calls) == steps, "the search must stop at the step the paper's bound allows"
  ours = [tuple(int(t) for t in row[:list(row).index(eos) + 1])
          for row in np.asarray(result.sequences[0])]
  assert ours == [seq[1:] for _, seq in full]
  np.testing.assert_allclose(np.asarray(result.scores[0]), [s for s, _ in full], rtol=1e-5)
