"""flax-transformer: the Transformer of "Attention Is All You Need" in JAX/Flax."""

from flax_transformer.network.attention import (MultiHeadAttention, attention_weights, causal_mask,
                                        padding_mask, scaled_dot_product_attention,
                                        segment_mask)
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.layers import (DecoderLayer, Embedding, EncoderLayer, FeedForward,
                                     PositionEncoding, SubLayer, sinusoidal_position_encoding)
from flax_transformer.network.model import (Decoder, Encoder, Transformer, count_params, init_cache,
                                    shift_right)
from flax_transformer.translation.search import beam_search, sample_search

__version__ = "0.1.0"


def __getattr__(name: str):
  # Translator reads workdirs (orbax, sentencepiece, grain): loaded on first use, so
  # that importing the model alone stays light.
  if name in ("SearchConfig", "Translator"):
    from flax_transformer.translation import translator

    return getattr(translator, name)
  raise AttributeError(f"module 'flax_transformer' has no attribute {name!r}")

__all__ = [
    "Decoder", "DecoderLayer", "Embedding", "Encoder", "EncoderLayer", "FeedForward",
    "MultiHeadAttention", "PositionEncoding", "SearchConfig", "SubLayer", "Transformer",
    "TransformerConfig", "Translator", "beam_search", "sample_search",
    "attention_weights", "causal_mask", "count_params", "init_cache", "padding_mask",
    "scaled_dot_product_attention", "segment_mask", "shift_right",
    "sinusoidal_position_encoding",
]
