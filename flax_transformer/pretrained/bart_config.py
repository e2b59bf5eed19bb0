"""The TransformerConfig of a BART-family config.json (Marian, FSMT, M2M100/NLLB): the
checks every importer repeated, and the fields they share, in one place."""

from __future__ import annotations

from pathlib import Path

from flax_transformer.errors import ConfigError, DataError
from flax_transformer.network import config as config_lib
from flax_transformer.network import config_fields

# Encoder and decoder sizes this model holds once: both of a pair must agree.
SAME = (("encoder_ffn_dim", "decoder_ffn_dim"),
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_layers", "num_hidden_layers"))


def model_config_from(config: dict, where: Path, *, same=SAME, **fields
                      ) -> config_lib.TransformerConfig:
  """`fields` (TransformerConfig's arguments, the architecture's mapping of `config`) over
  what the family shares (biased attention, torch's LayerNorm epsilon, fairseq's halves
  position layout). A DataError line naming `where` for values this model cannot hold;
  a ConfigError for a TransformerConfig field no import knows (network/config_fields.py)."""
  for a, b in same:
    if a in config and b in config and config[a] != config[b]:
      raise DataError(f"{where}: {a}={config[a]} and {b}={config[b]} differ; this model has "
                      "one value for both")
  d_model, heads = fields["d_model"], fields["num_heads"]
  if d_model % heads:
    raise DataError(f"{where}: d_model={d_model} is not divisible by the {heads} heads")
  try:
    model_config = config_lib.TransformerConfig(
        **{"attention_bias": True, "layer_norm_epsilon": 1e-5, "position_layout": "halves",
           **fields})
  except ValueError as e:
    raise DataError(f"{where}: {e}") from None
  # Every computed field is set: only one in neither list is refused.
  if problem := config_fields.refusal(model_config, config_fields.COMPUTED_FIELDS, str(where),
                                      "an import"):
    raise ConfigError(problem)
  return model_config
