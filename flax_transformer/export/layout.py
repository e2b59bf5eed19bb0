"""Our parameters in the layout of torch-style frameworks: one walk, shared by the converters.

`unpack` reads a parameter tree into plain float32 numpy arrays (without the rows an
import added to a vocabulary for sharding: `vocab_padding`), named by role
(each attention's W^Q, W^K, W^V, W^O, each block's LayerNorm, the FFN, the
embeddings, the positions, the pre-softmax matrix), with every linear map as a
[out, in] weight. Our kernels are [in, (heads, d_k)] and W^O's [heads, d_v, out].
CTranslate2 (`ct2`) and transformers' Marian (`marian`) then only name and group them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.layers import PositionEncoding


@dataclasses.dataclass
class Linear:
  weight: np.ndarray  # [out, in]
  bias: np.ndarray | None  # [out]; None where the model has none.


@dataclasses.dataclass
class Norm:
  scale: np.ndarray  # [D]
  bias: np.ndarray  # [D]


@dataclasses.dataclass
class Attention:
  query: Linear
  key: Linear
  value: Linear
  out: Linear
  norm: Norm  # The LayerNorm of the residual block around it.


@dataclasses.dataclass
class Layer:
  self_attention: Attention
  cross_attention: Attention | None  # Decoder layers only.
  w1: Linear  # [d_ff, D]
  w2: Linear  # [D, d_ff]
  ffn_norm: Norm


@dataclasses.dataclass
class Stack:
  embedding: np.ndarray  # [V, D], unscaled.
  positions: np.ndarray  # [max_len, D]: what position j adds (offset and layout applied).
  layers: list[Layer]
  final_norm: Norm | None  # Pre-norm only.


@dataclasses.dataclass
class Model:
  encoder: Stack
  decoder: Stack
  logits: np.ndarray  # [V, D]: the pre-softmax matrix (the target embedding when tied).
  logits_bias: np.ndarray | None  # [V]


def _array(x) -> np.ndarray:
  return np.array(x, np.float32)


def dense(module: dict[str, Any]) -> Linear:
  """A Dense or attention projection: kernel [in, ...out] -> weight [out, in]."""
  kernel = _array(module["kernel"])
  bias = module.get("bias")
  return Linear(np.ascontiguousarray(kernel.reshape(kernel.shape[0], -1).T),
                None if bias is None else _array(bias).reshape(-1))


def out_projection(module: dict[str, Any]) -> Linear:
  """W^O: kernel [heads, d_v, D] -> weight [D, heads * d_v]."""
  kernel = _array(module["kernel"])
  bias = module.get("bias")
  return Linear(np.ascontiguousarray(kernel.reshape(-1, kernel.shape[-1]).T),
                None if bias is None else _array(bias))


def norm(module: dict[str, Any]) -> Norm:
  return Norm(_array(module["scale"]), _array(module["bias"]))


def attention(module: dict[str, Any], block: dict[str, Any]) -> Attention:
  return Attention(dense(module["query"]), dense(module["key"]), dense(module["value"]),
                   out_projection(module["out"]), norm(block["norm"]))


def positions(config: TransformerConfig, params: dict[str, Any], side: str) -> np.ndarray:
  """[max_len, D]: what the model adds at positions 0..max_len-1, from its own module
  (sinusoidal or learned, in whatever layout and offset the config gives)."""
  module = PositionEncoding(config)
  variables = ({"params": params[side]["position"]} if "position" in params[side] else {})
  rows = jnp.arange(config.max_len, dtype=jnp.int32)[None]
  return _array(module.apply(variables, jnp.zeros((1, config.max_len, config.d_model)),
                             rows)[0])


def _zero_row_0(matrix: np.ndarray) -> np.ndarray:
  out = matrix.copy()
  out[0] = 0
  return out


def unpack(config: TransformerConfig, params: dict[str, Any]) -> Model:
  """`params` (boxed or not) as a `Model` of float32 [out, in] arrays."""
  params = nn.unbox(params)  # Freshly initialised parameters carry their sharding axes.
  if config.share_embeddings:
    source = target = _array(params["shared_embedding"]["embedding"])
  else:
    source = _array(params["source_embedding"]["embedding"])
    target = _array(params["target_embedding"]["embedding"])
  decoder = params["decoder"]
  logits = target if "logits" not in decoder else dense(decoder["logits"]).weight
  bias = decoder.get("final_logits_bias")
  if config.start_from_zero_embedding:  # The rows the model holds at zero, as zeros.
    zeroed = {id(m): _zero_row_0(m) for m in (source, target, logits)}  # Shared stay shared.
    source, target, logits = (zeroed[id(m)] for m in (source, target, logits))
  # Rows an import added for sharding (vocab_padding, source_vocab_padding): not written.
  real = config.without_vocab_padding()
  source, target, logits = source[:real.source_vocab], target[:real.vocab_size], logits[
      :real.vocab_size]
  bias = None if bias is None else bias[:real.vocab_size]

  def stack(side: str, embedding: np.ndarray, count: int) -> Stack:
    ours, decoding = params[side], side == "decoder"
    final = ours.get("final_norm")
    return Stack(embedding, positions(config, params, side),
                 [layer(ours[f"layer_{i}"], "self_attention_block" if decoding
                        else "attention_block", decoding) for i in range(count)],
                 None if final is None else norm(final))

  def layer(ours, self_block: str, cross: bool) -> Layer:
    ffn = ours["ffn"]
    return Layer(attention(ours["self_attention"], ours[self_block]),
                 attention(ours["cross_attention"], ours["cross_attention_block"]) if cross
                 else None, dense(ffn["w1"]), dense(ffn["w2"]), norm(ours["ffn_block"]["norm"]))

  return Model(stack("encoder", source, config.encoder_layers),
               stack("decoder", target, config.decoder_layers),
               logits, None if bias is None else _array(bias))
