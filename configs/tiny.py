"""A few-second model on Multi30k EN->DE, for tests and smoke runs (not for quality)."""

from configs import multi30k


def get_config():
  config = multi30k.get_config()
  config.vocab_size = 1000
  config.model.d_model = 32
  config.model.d_ff = 64
  config.model.num_heads = 4
  config.model.num_layers = 1
  config.model.max_len = 64
  config.max_source_length = 32
  config.max_target_length = 32
  config.batch_tokens = 512
  config.num_train_steps = 100
  config.warmup_steps = 10
  config.learning_rate = 0.3
  config.log_every_steps = 10
  config.eval_every_steps = 50
  config.num_eval_steps = 2
  config.bleu_every_steps = 50
  config.num_bleu_sentences = 16
  config.checkpoint_every_steps = 50
  config.beam_size = 2
  config.max_extra = 10
  config.vocab_max_sentences = 5000
  return config
