"""The training config's checks: settings that cannot work are refused before anything
expensive starts (a `ConfigError` naming the key)."""

from __future__ import annotations

from flax_transformer.errors import ConfigError
from flax_transformer.network.config import TransformerConfig
from flax_transformer.training.steps import CROSS_ENTROPY_BACKWARDS


def model_config_from(config) -> TransformerConfig:
  try:
    return TransformerConfig.from_dict(config.model.to_dict())
  except ValueError as e:
    raise ConfigError(f"config.model: {e}") from None


PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def check_config(config, model: TransformerConfig | None = None) -> None:
  """Rejects settings that cannot work before anything expensive starts.

  model: the run's model config when it is not `config.model`'s (fine-tuning's, the
  source's: training.init_from)."""
  positive = ("num_train_steps", "warmup_steps", "batch_tokens", "max_source_length",
              "max_target_length", "grad_accum_steps", "log_every_steps",
              "checkpoint_every_steps", "eval_every_steps", "eval_batch_tokens", "beam_size",
              "eval_max_shapes")
  for key in positive:
    if config[key] <= 0:
      raise ConfigError(f"config.{key} must be positive, got {config[key]}")
  if config.prefetch_batches < 0:
    raise ConfigError(f"config.prefetch_batches must be >= 0, got {config.prefetch_batches}")
  if config.data_workers < -1:
    raise ConfigError(f"config.data_workers must be >= 0, or -1 for automatic, got "
                      f"{config.data_workers}")
  for key in ("bleu_every_steps", "test_bleu_every_steps", "checkpoint_every_minutes"):
    if config[key] < 0:
      raise ConfigError(f"config.{key} must be >= 0 (0 = never), got {config[key]}")
  if not 0.0 <= config.label_smoothing < 1.0:
    raise ConfigError(f"config.label_smoothing must be in [0, 1), got {config.label_smoothing}")
  if not 0.0 <= config.subword_sampling_alpha < 1.0:
    raise ConfigError("config.subword_sampling_alpha must be in [0, 1) (0 = off), got "
                      f"{config.subword_sampling_alpha}")
  if config.nan_policy not in ("stop", "skip"):
    raise ConfigError(f"config.nan_policy must be 'stop' or 'skip', got {config.nan_policy!r}")
  if config.cross_entropy_backward not in CROSS_ENTROPY_BACKWARDS:
    raise ConfigError(f"config.cross_entropy_backward must be one of {CROSS_ENTROPY_BACKWARDS}, "
                      f"got {config.cross_entropy_backward!r}")
  temperature = config.get("pair_temperature", 1.0)
  if not temperature > 0:  # NaN too: refused here, before the data is read.
    raise ConfigError(f"config.pair_temperature={temperature!r}: must be > 0 (1 = the "
                      "corpora's proportions, 5 = close to uniform)")
  if config.prng_impl not in PRNG_IMPLS:
    raise ConfigError(f"config.prng_impl must be one of {', '.join(PRNG_IMPLS)}, got "
                      f"{config.prng_impl!r}")
  if config.profile_steps < 0 or config.profile_first_step < 0:
    raise ConfigError("config.profile_steps and config.profile_first_step must be >= 0, got "
                      f"{config.profile_steps} and {config.profile_first_step}")
  if model is None:
    model, whose, fix = model_config_from(config), "config.model.max_len", "raise model.max_len"
  else:
    whose, fix = "the max_len of config.init_from's model", "lower them"
  longest = max(config.max_source_length, config.max_target_length)
  if longest > model.max_len:
    raise ConfigError(f"config.max_source_length/max_target_length ({longest}) exceed {whose} "
                      f"({model.max_len}); {fix}")
