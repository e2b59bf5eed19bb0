"""Multi30k EN->DE (29k caption pairs), sized for a good model from a CPU run of 2 cores.

`--config.target_lang=fr` for EN->FR. Deviations from the paper's base model,
for a dataset ~150x smaller than WMT14 and a CPU budget: d_model 256, d_ff
1024, 4 heads, 3+3 layers, an 8k shared vocabulary, ~3k-token batches,
warmup 1000. Data is read from `local_copy` (shared/data/multi30k beside the
checkout, whatever the working directory) where it holds the files, else fetched from the dataset's public repository (the log says which);
`--config.manual_dir=DIR` reads DIR only.
"""

import os

from configs import default

# The checkout's parent: ../shared beside it, as the README says, from any working directory.
BESIDE_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def get_config():
  config = default.get_config()
  config.dataset_name = "multi30k"
  config.local_copy = os.path.join(BESIDE_CHECKOUT, "shared", "data", "multi30k")
  config.eval_split = "validation"
  config.test_split = "test_2016_flickr"
  config.source_lang = "en"
  config.target_lang = "de"

  config.vocab_size = 8000
  config.vocab_max_sentences = 100_000

  config.model.d_model = 256
  config.model.d_ff = 1024
  config.model.num_heads = 4
  config.model.num_layers = 3
  config.model.max_len = 128

  config.max_source_length = 64
  config.max_target_length = 64
  config.batch_tokens = 3072
  # Seconds per step depend on the host and on what else runs there. The README's run
  # of this config (results/runs/multi30k_en-de_paper_exact/: train.log, and the JSON's
  # train_wall_s and machine) trained 2000 steps in 22 minutes on a 2-core AMD EPYC host
  # on 2026-11-26; the README renders its figure from that JSON.
  config.num_train_steps = 2000
  config.warmup_steps = 1000
  config.log_every_steps = 50
  config.eval_every_steps = 200
  config.bleu_every_steps = 400  # Beam 4 over the 1014 validation sentences (~1 min).
  config.num_bleu_sentences = -1
  config.eval_batch_tokens = 4096
  config.checkpoint_every_steps = 200
  config.keep_checkpoints = 5  # decode.py --average_last=5 averages steps 1200..2000.
  return config
