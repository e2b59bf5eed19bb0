"""The model's hyper-parameters, under the paper's names (Vaswani et al., 2017)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from flax_transformer.network.activations import ACTIVATIONS

POSITIONAL = ("sinusoidal", "learned")
NORMS = ("post", "pre")
POSITION_LAYOUTS = ("interleaved", "halves")
POSITION_FREQUENCIES = ("paper", "fairseq")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters of the encoder-decoder Transformer.

  Defaults are the paper's base model (Table 3, first row). `d_k` / `d_v` of
  None mean `d_model // num_heads`; `num_encoder_layers` / `num_decoder_layers`
  of None mean `num_layers`. Token id 0 is padding.

  The fields after `attention_implementation` are where pretrained models
  (`flax_transformer.pretrained`: Marian/OPUS-MT, FSMT) differ from the paper;
  their defaults are the paper's model, parameter tree and outputs unchanged.
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
  # FFN nonlinearity: 'relu' (paper eq. 2), 'swish' (= SiLU; most OPUS-MT models),
  # 'gelu' (exact, erf: torch's and transformers' "gelu"), 'gelu_tanh' (tanh approximation).
  activation: str = "relu"
  scale_embedding: bool = True  # Embeddings times sqrt(d_model) (paper section 3.4).
  # Sinusoid table: 'interleaved' (paper: sin and cos of a frequency side by side) or
  # 'halves' (all sines, then all cosines: Marian in transformers, fairseq).
  position_layout: str = "interleaved"
  # Frequencies 10000^(-2i/d_model) ('paper') or 10000^(-i/(d_model/2 - 1)) ('fairseq',
  # also tensor2tensor's).
  position_frequencies: str = "paper"
  # Token j of a sequence takes row j + position_offset of a table of max_len +
  # position_offset rows (fairseq: padding_idx + 1).
  position_offset: int = 0
  final_logits_bias: bool = False  # A learned bias [V] on the logits (Marian).
  # The encoder's vocabulary size; None = vocab_size (which is then the target side:
  # the decoder's embedding and the logits). Another size needs share_embeddings=False.
  source_vocab_size: int | None = None
  # With share_embeddings=False: the target embedding is also the pre-softmax matrix
  # (no separate 'logits' layer), as in Marian/FSMT with separate vocabularies.
  tie_target_embedding: bool = False
  # The id the decoder embeds for its start token (the 0 shifted in before the
  # targets); fairseq starts from EOS (1). Masks still take only the real targets.
  decoder_start_id: int = 0
  # Id 0's row (padding, the decoder's start token) held at zero on the target side, not
  # learned: the decoder starts from the zero vector (Marian-NMT; CTranslate2's
  # start_from_zero_embedding) and padding's logit is its bias alone, as in OPUS-MT's
  # transformers models, whose padding row is zeros. Needs decoder_start_id=0.
  start_from_zero_embedding: bool = False
  # The last `vocab_padding` ids are rows added so that the vocabulary splits over a
  # tensor axis (NLLB's 256,206 splits over none): their logits are -inf, so they are never
  # produced, carry no probability, and take no gradient; an export drops them.
  vocab_padding: int = 0
  # The same for a separate source vocabulary (source_vocab_size): its last rows, added
  # for sharding, are never fed (no tokenizer gives their ids); an export drops them.
  source_vocab_padding: int = 0

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
    for name, allowed in (("activation", tuple(ACTIVATIONS)), ("position_layout", POSITION_LAYOUTS),
                          ("position_frequencies", POSITION_FREQUENCIES)):
      if getattr(self, name) not in allowed:
        problems.append(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
    if self.positional == "sinusoidal" and self.d_model % 2 and (
        self.position_layout != "interleaved" or self.position_frequencies != "paper"):
      problems.append(f"position_layout {self.position_layout!r} / position_frequencies "
                      f"{self.position_frequencies!r} need an even d_model, got {self.d_model}")
    if self.position_frequencies == "fairseq" and self.d_model < 4:
      problems.append("position_frequencies='fairseq' needs d_model >= 4")
    if int(self.position_offset) < 0:
      problems.append(f"position_offset must be >= 0, got {self.position_offset}")
    if self.source_vocab_size is not None:
      if int(self.source_vocab_size) <= 0:
        problems.append(f"source_vocab_size must be positive or None, got "
                        f"{self.source_vocab_size}")
      elif self.share_embeddings and self.source_vocab_size != self.vocab_size:
        problems.append(f"source_vocab_size={self.source_vocab_size} differs from vocab_size="
                        f"{self.vocab_size}: separate vocabularies need share_embeddings=False")
    if not 0 <= int(self.decoder_start_id) < self.vocab_size:
      problems.append(f"decoder_start_id must be in [0, vocab_size={self.vocab_size}), got "
                      f"{self.decoder_start_id}")
    problems += self._padding_problems()
    if self.start_from_zero_embedding and self.decoder_start_id:
      problems.append(f"start_from_zero_embedding starts the decoder from id 0's (zero) row; "
                      f"decoder_start_id={self.decoder_start_id} names another")
    for name in ("dtype", "param_dtype"):
      try:
        object.__setattr__(self, name, jnp.dtype(getattr(self, name)))
      except TypeError:
        problems.append(f"{name} is not a dtype: {getattr(self, name)!r}")
    if problems:
      raise ValueError("Invalid TransformerConfig: " + "; ".join(problems))

  def _padding_problems(self) -> list[str]:
    problems = []
    if not 0 <= int(self.vocab_padding) < self.vocab_size - 2:
      problems.append(f"vocab_padding must be in [0, vocab_size - 2), got {self.vocab_padding}")
    if self.source_vocab_padding and (self.source_vocab_size is None or not 0 <= int(
        self.source_vocab_padding) < self.source_vocab_size - 2):
      problems.append(f"source_vocab_padding={self.source_vocab_padding} needs a separate "
                      "source vocabulary (source_vocab_size) of more than that + 2 rows")
    return problems

  @property
  def head_dim_k(self) -> int:
    """d_k: width of each head's queries and keys."""
    return self.d_k if self.d_k is not None else self.d_model // self.num_heads

  @property
  def head_dim_v(self) -> int:
    """d_v: width of each head's values."""
    return self.d_v if self.d_v is not None else self.d_model // self.num_heads

  @property
  def source_vocab(self) -> int:
    """The encoder's vocabulary size (`source_vocab_size`, else `vocab_size`)."""
    return self.source_vocab_size if self.source_vocab_size is not None else self.vocab_size

  def without_vocab_padding(self) -> "TransformerConfig":
    """This config with the vocabularies' padding rows (vocab_padding,
    source_vocab_padding) gone: the model an export writes."""
    source = self.source_vocab_size
    return self.replace(vocab_size=self.vocab_size - self.vocab_padding, vocab_padding=0,
                        source_vocab_size=None if source is None else
                        source - self.source_vocab_padding, source_vocab_padding=0)

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
