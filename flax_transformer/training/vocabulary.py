"""A training run's vocabulary and model config: the tokenizer built (or loaded) from the
training pairs, the model's vocabulary size set to its size, or a fine-tuning source's
both; process 0 records the launch in run.json (`workdir.record_launch`)."""

from __future__ import annotations

import logging

import jax

from flax_transformer import workdir as workdir_lib
from flax_transformer.data import pipeline as data_lib
from flax_transformer.training import init_from
from flax_transformer.training.config_checks import model_config_from


def run_vocabulary(config, workdir: workdir_lib.Workdir, train_pairs, launch: dict | None,
                   fine_tuning: init_from.FineTuning | None):
  """The run's tokenizer (built or loaded) and its model config, whose vocabulary size is
  the tokenizer's; a fine-tuning run's are its source's. Process 0 records the launch."""
  if fine_tuning:
    if jax.process_index() == 0:
      if not fine_tuning.resuming:
        init_from.copy_tokenizer(fine_tuning, workdir)
      record_launch(config, workdir, fine_tuning.model_config, fine_tuning.vocab_size,
                    launch, fine_tuning.record_entries())
    return fine_tuning.tokenizer, fine_tuning.model_config
  model_config = model_config_from(config)
  tokenizer = data_lib.build_tokenizer(config, workdir.vocab_file, train_pairs,
                                       jax.process_index())
  if tokenizer.vocab_size != model_config.vocab_size:
    logging.info("Model vocabulary size %d -> %d (the vocabulary's)", model_config.vocab_size,
                 tokenizer.vocab_size)
    model_config = model_config.replace(vocab_size=tokenizer.vocab_size)
  if jax.process_index() == 0:
    record_launch(config, workdir, model_config, tokenizer.vocab_size, launch)
  return tokenizer, model_config


def record_launch(config, workdir: workdir_lib.Workdir, model_config, vocab_size: int,
                  launch: dict | None, entries: dict | None = None) -> None:
  """This launch in run.json: how it was asked for, its config and process count."""
  workdir_lib.record_launch(workdir, model_config, vocab_size, {
      **(launch or {}), "config": config.to_dict(), "process_count": jax.process_count()},
      entries=entries)
