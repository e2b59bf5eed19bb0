"""The model's hyper-parameters, under the paper's names (Vaswani et al., 2017)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

POSITIONAL = ("sinusoidal", "learned")
NORMS = ("post", "pre")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters of the encoder-decoder Transformer.

  Defaults are the paper's base model (Table 3, first row). `d_k` / `d_v` of
  None mean `d_model // num_heads`; `num_encoder_layers` / `num_decoder_layers`
  of None mean `num_layers`. Token id 0 is padding.
  """

  vocab_size: int = 37000
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  d_k: int | None = None
  d_v: int | None = None
  num_layers: int = 6
  num_encoder_layers: int | None = None
  num_decoder_layers: int | None = None
  dropout_rate: float = 0.1  # P_drop: residual and embedding dropout.
  attention_dropout_rate: float = 0.0  # The paper uses none; an option.
  max_len: int = 256  # Longest sequence the position encoding covers.
  share_embeddings: bool = True  # Source, target and pre-softmax share one matrix.
  # Biases on W^Q, W^K, W^V and W^O. The paper's projections have none (section
  # 3.2.2); True adds them, as many implementations (and this one before) do.
  attention_bias: bool = False
  positional: str = "sinusoidal"  # 'sinusoidal' (paper) | 'learned' (Table 3 E).
  norm: str = "post"  # 'post' (paper) | 'pre' (plus a final LayerNorm).
  layer_norm_epsilon: float = 1e-6
  dtype: Any = "float32"  # Activations / computation dtype.
  param_dtype: Any = "float32"
  deterministic: bool = False  # True disables dropout (evaluation, decoding).
  decode: bool = False  # True: one target token per call with a key/value cache.
  # With decode: a sentence's beams share one cache. Its encoder output is
  # projected to cross-attention keys/values once, and each beam's
  # self-attention keys/values stay in the slot that wrote them (read through
  # a per-beam history mask), so the search reorders no cached tensor. False:
  # per-beam copies, projected every step and reordered with the beams, as most
  # implementations do (kept to measure the difference).
  share_beam_cache: bool = True
  # 'auto': cuDNN's fused attention on a GPU for bf16/fp16, else XLA; 'xla'; 'cudnn'.
  attention_implementation: str = "auto"

  def __post_init__(self):
    problems = []
    for name in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "max_len"):
      if int(getattr(self, name)) <= 0:
        problems.append(f"{name} must be positive, got {getattr(self, name)}")
    for name in ("d_k", "d_v", "num_encoder_layers", "num_decoder_layers"):
      value = getattr(self, name)
      if value is not None and int(value) <= 0:
        problems.append(f"{name} must be positive or None, got {value}")
    if (self.d_k is None or self.d_v is None) and self.d_model % self.num_heads:
      problems.append(
          f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}: "
          "choose num_heads dividing d_model, or set d_k and d_v explicitly")
    for name in ("dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        problems.append(f"{name} must be in [0, 1), got {getattr(self, name)}")
    if self.positional not in POSITIONAL:
      problems.append(f"positional must be one of {POSITIONAL}, got {self.positional!r}")
    if self.attention_implementation not in ("auto", "xla", "cudnn"):
      problems.append("attention_implementation must be 'auto', 'xla' or 'cudnn', got "
                      f"{self.attention_implementation!r}")
    if self.norm not in NORMS:
      problems.append(f"norm must be one of {NORMS}, got {self.norm!r}")
    for name in ("dtype", "param_dtype"):
      try:
        object.__setattr__(self, name, jnp.dtype(getattr(self, name)))
      except TypeError:
        problems.append(f"{name} is not a dtype: {getattr(self, name)!r}")
    if problems:
      raise ValueError("Invalid TransformerConfig: " + "; ".join(problems))

  @property
  def head_dim_k(self) -> int:
    """d_k: width of each head's queries and keys."""
    return self.d_k if self.d_k is not None else self.d_model // self.num_heads

  @property
  def head_dim_v(self) -> int:
    """d_v: width of each head's values."""
    return self.d_v if self.d_v is not None else self.d_model // self.num_heads

  @property
  def encoder_layers(self) -> int:
    return self.num_encoder_layers if self.num_encoder_layers is not None else self.num_layers

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers if self.num_decoder_layers is not None else self.num_layers

  def replace(self, **changes) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    """Plain JSON-able values (dtypes as names)."""
    out = dataclasses.asdict(self)
    out["dtype"] = jnp.dtype(self.dtype).name
    out["param_dtype"] = jnp.dtype(self.param_dtype).name
    return out

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "TransformerConfig":
    """Builds a config, naming any key that is not a field."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"Unknown model config key(s): {', '.join(unknown)}; "
                       f"known keys: {', '.join(sorted(fields))}")
    return cls(**dict(values))
