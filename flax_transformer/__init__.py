"""flax-transformer: the Transformer of "Attention Is All You Need" in JAX/Flax."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # What type checkers and IDEs see; at run time, _EXPORTS below.
  from flax_transformer.network.attention import (  # noqa: F401
      MultiHeadAttention, attention_weights, causal_mask, padding_mask,
      scaled_dot_product_attention, segment_mask)
  from flax_transformer.network.config import TransformerConfig  # noqa: F401
  from flax_transformer.network.layers import (  # noqa: F401
      DecoderLayer, Embedding, EncoderLayer, FeedForward, PositionEncoding, SubLayer,
      sinusoidal_position_encoding)
  from flax_transformer.network.model import (  # noqa: F401
      Decoder, Encoder, Transformer, count_params, init_cache, shift_right)
  from flax_transformer.translation.search import beam_search, sample_search  # noqa: F401
  from flax_transformer.translation.search_config import SearchConfig  # noqa: F401
  from flax_transformer.translation.translator import Translator  # noqa: F401

__version__ = "0.1.0"

# Each public name -> the module that defines it, loaded on first use (PEP 562): importing
# a submodule (the entry points' malloc re-exec, config files) then loads neither JAX nor
# Flax, and `from flax_transformer import Transformer` loads the model only.
_EXPORTS = {
    "flax_transformer.network.attention": (
        "MultiHeadAttention", "attention_weights", "causal_mask", "padding_mask",
        "scaled_dot_product_attention", "segment_mask"),
    "flax_transformer.network.config": ("TransformerConfig",),
    "flax_transformer.network.layers": (
        "DecoderLayer", "Embedding", "EncoderLayer", "FeedForward", "PositionEncoding",
        "SubLayer", "sinusoidal_position_encoding"),
    "flax_transformer.network.model": (
        "Decoder", "Encoder", "Transformer", "count_params", "init_cache", "shift_right"),
    "flax_transformer.translation.search": ("beam_search", "sample_search"),
    # Translator reads workdirs (orbax, sentencepiece, grain).
    "flax_transformer.translation.search_config": ("SearchConfig",),
    "flax_transformer.translation.translator": ("Translator",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
  if name not in _MODULE_OF:
    try:  # A subpackage (`flax_transformer.network`), as the eager imports once bound.
      return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
      if e.name != f"{__name__}.{name}":
        raise
      raise AttributeError(f"module 'flax_transformer' has no attribute {name!r}") from None
  value = getattr(importlib.import_module(_MODULE_OF[name]), name)
  globals()[name] = value  # Looked up once.
  return value


def __dir__() -> list[str]:
  return sorted({*globals(), *__all__})
