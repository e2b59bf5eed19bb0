"""Attention heads as a PNG grid, as in the paper's Figures 3-5."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from flax_transformer.network.model import Transformer


def attention_maps(model_config, params, source_ids: np.ndarray, target_ids: np.ndarray):
  """Last-layer encoder self-attention [N, S, S] and encoder-decoder attention [N, T, S]."""
  model = Transformer(model_config.replace(deterministic=True, decode=False))
  _, state = model.apply({"params": params}, jnp.asarray(source_ids)[None],
                         jnp.asarray(target_ids)[None], mutable=["intermediates"])
  inter = state["intermediates"]
  encoder = inter["encoder"][f"layer_{model_config.encoder_layers - 1}"]
  decoder = inter["decoder"][f"layer_{model_config.decoder_layers - 1}"]
  return (np.asarray(encoder["self_attention"]["attention_weights"][0][0]),
          np.asarray(decoder["cross_attention"]["attention_weights"][0][0]))


def plot_attention(translator, source: str, translation: str, path: str) -> None:
  """Writes a grid: row 1 encoder self-attention heads, row 2 encoder-decoder heads.

  Of an ensemble, the first member's attention.
  """
  import matplotlib  # Heavy: only when a plot is asked for.

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  tok = translator.tokenizer
  model_config, params = translator.member(0)
  source_ids = tok.source.tokenize(source)[:model_config.max_len]
  target_ids = tok.target.tokenize(translation)[:model_config.max_len]
  self_attn, cross_attn = attention_maps(model_config, params, source_ids, target_ids)
  source_labels, target_labels = tok.source.pieces(source_ids), tok.target.pieces(target_ids)
  heads = self_attn.shape[0]
  size = max(3.0, 0.25 * len(source_labels))
  fig, axes = plt.subplots(2, heads, figsize=(size * heads, size * 2), squeeze=False)
  rows = [(self_attn, source_labels, "encoder self-attention"),
          (cross_attn, target_labels, "encoder-decoder attention")]
  for row, (weights, y_labels, title) in enumerate(rows):
    for head in range(heads):
      ax = axes[row][head]
      ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0)
      ax.set_xticks(range(len(source_labels)), source_labels, rotation=90, fontsize=7)
      ax.set_yticks(range(len(y_labels)), y_labels, fontsize=7)
      ax.set_title(f"{title}, head {head + 1}", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)
