"""What the transformers exports (`marian`, `m2m100`) share: our layers under the
BART-family names their modeling files keep from modeling_bart (`layer_tensors`), and
the writing of the folder (`write_folder`).

Each layer: self_attn (and encoder_attn in the decoder) with q_proj, k_proj, v_proj,
out_proj and the LayerNorm of its residual block (self_attn_layer_norm,
encoder_attn_layer_norm), fc1, fc2 and final_layer_norm; a pre-norm stack's final
LayerNorm is its layer_norm. Every projection has a bias: zeros where ours has none.
The embeddings, positions and logits are each export's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from flax_transformer.export import layout, write_manifest
from flax_transformer.languages import Languages

# Our attention projections as transformers names them, and which of each one's sides is
# the model dimension (reads: its input, writes: its output), which a permutation of the
# model dimension reorders.
ATTENTION = (("query", "q_proj", True, False), ("key", "k_proj", True, False),
             ("value", "v_proj", True, False), ("out", "out_proj", False, True))


def layer_tensors(model: layout.Model, perm: np.ndarray | None = None
                  ) -> dict[str, np.ndarray]:
  """Both stacks' layer weights as a state dict, the model dimension permuted by `perm`
  (transformers' index j holds ours perm[j]; None: as ours)."""
  out: dict[str, np.ndarray] = {}

  def model_dim(array: np.ndarray, axis: int = 0) -> np.ndarray:
    """`array` with its model-dimension axis permuted (not copied when `perm` is None)."""
    return array if perm is None else np.take(array, perm, axis=axis)

  def linear(name: str, linear: layout.Linear, reads: bool, writes: bool) -> None:
    weight = model_dim(linear.weight) if writes else linear.weight
    weight = model_dim(weight, axis=1) if reads else weight
    bias = np.zeros(weight.shape[0], np.float32) if linear.bias is None else linear.bias
    out[f"{name}.weight"] = np.ascontiguousarray(weight)
    out[f"{name}.bias"] = model_dim(bias) if writes else bias

  def norm(name: str, norm: layout.Norm) -> None:
    out[f"{name}.weight"], out[f"{name}.bias"] = model_dim(norm.scale), model_dim(norm.bias)

  for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
    for i, layer in enumerate(stack.layers):
      prefix = f"model.{side}.layers.{i}"
      for block, attention in (("self_attn", layer.self_attention),
                               ("encoder_attn", layer.cross_attention)):
        if attention is None:  # Encoder layers: no cross-attention.
          continue
        for ours, theirs, reads, writes in ATTENTION:
          linear(f"{prefix}.{block}.{theirs}", getattr(attention, ours), reads, writes)
        norm(f"{prefix}.{block}_layer_norm", attention.norm)
      linear(f"{prefix}.fc1", layer.w1, reads=True, writes=False)
      linear(f"{prefix}.fc2", layer.w2, reads=False, writes=True)
      norm(f"{prefix}.final_layer_norm", layer.ffn_norm)
    if stack.final_norm is not None:  # Pre-norm only.
      norm(f"model.{side}.layer_norm", stack.final_norm)
  return out


def languages_entry(languages: Languages | None) -> dict[str, Any]:
  """manifest.json's "languages": the workdir's record (flax_transformer.languages), where
  it states any; import_model.py reads it back (transformers' files cannot say that a
  model trained here chooses its target by '<2de>' forced first)."""
  if languages is None or not languages.stated:
    return {}
  return {"languages": languages.to_json()}


def write_folder(out_dir: str | Path, files: dict[str, Any], manifest: dict) -> Path:
  """Writes `files` (name -> bytes, or a JSON value: indented, UTF-8, as transformers'
  save_pretrained writes its own) into `out_dir`, then `manifest` (`write_manifest`)."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  for name, value in files.items():
    (out / name).write_bytes(value if isinstance(value, bytes) else (
        json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode())
  write_manifest(out, manifest)
  return out
