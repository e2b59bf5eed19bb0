"""What each `TransformerConfig` field is to an export or an import: one list they all check.

COMPUTED_FIELDS change the function the trained network computes: an export writes each
one it can (its own `handled` set) and refuses any other away from its default; an
import sets each its model needs and leaves the others at the paper's defaults.
NOT_COMPUTED_FIELDS say how it runs or trains (dtypes, dropout, decoding mode): nothing
to write. A field in neither list is refused by every export and import
(`unhandled_field`), so that a new field is never dropped silently by any of them.
"""

from __future__ import annotations

import dataclasses
from typing import Collection

from flax_transformer.network.config import TransformerConfig

COMPUTED_FIELDS = frozenset({
    "vocab_size", "d_model", "d_ff", "num_heads", "d_k", "d_v", "num_layers",
    "num_encoder_layers", "num_decoder_layers", "max_len", "share_embeddings",
    "attention_bias", "positional", "norm", "layer_norm_epsilon", "activation",
    "scale_embedding", "position_layout", "position_frequencies", "position_offset",
    "final_logits_bias", "source_vocab_size", "tie_target_embedding", "decoder_start_id",
    "start_from_zero_embedding",
    "vocab_padding", "source_vocab_padding"})  # (issue 77: vocabularies padded to shard)
NOT_COMPUTED_FIELDS = frozenset({
    "dropout_rate", "attention_dropout_rate", "dtype", "param_dtype", "deterministic",
    "decode", "share_beam_cache", "attention_implementation"})


def unhandled_field(config: TransformerConfig, handled: Collection[str]
                    ) -> tuple[str, object, str] | None:
  """(field, value, why) of the first field of `config` that a path handling `handled`
  (the computed fields it writes or sets) cannot carry: one in neither list (why:
  'unclassified'), or a computed one it does not handle, away from its default
  ('unhandled'); None if it carries them all."""
  defaults = type(config)()
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if field.name not in COMPUTED_FIELDS | NOT_COMPUTED_FIELDS:
      return field.name, value, "unclassified"
    if (field.name in COMPUTED_FIELDS and field.name not in handled
        and value != getattr(defaults, field.name)):
      return field.name, value, "unhandled"
  return None


def unclassified_message(field: str) -> str:
  return (f"TransformerConfig.{field} is in neither network.config_fields.COMPUTED_FIELDS "
          "nor NOT_COMPUTED_FIELDS: no export or import knows what to do with it")


def refusal(config: TransformerConfig, handled: Collection[str], who: str, target: str
            ) -> str | None:
  """The one line "`who`: ..." naming the first field of `config` that a path handling
  `handled` cannot carry into `target` (`unhandled_field`); None if it carries them all.
  The path raises it as its error (a ConfigError)."""
  problem = unhandled_field(config, handled)
  if problem and problem[2] == "unclassified":
    return f"{who}: {unclassified_message(problem[0])}"
  if problem:
    return f"{who}: this model's {problem[0]}={problem[1]!r} has no equivalent in {target}"
  return None
