"""Tokens per second the input pipeline produces vs what a training step consumes.

python bench/input_pipeline.py [--json PATH] [--batches 50] [--repeats 5]
    [--subword_sampling_alpha 0.1]
Multi30k EN->DE train, configs/multi30k.py batching (packed rows), on this machine;
with --subword_sampling_alpha, every pair is segmented afresh (BPE-dropout).
"""

from __future__ import annotations

import tempfile
import time

from common import MULTI30K, machine, median, parser, print_table, time_train_step, timings, \
    write_json


def main():
  flags = parser(__doc__)
  flags.add_argument("--batches", type=int, default=50, help="batches per timed run")
  flags.add_argument("--repeats", type=int, default=5, help="timed runs (median reported)")
  flags.add_argument("--subword_sampling_alpha", type=float, default=0.0,
                     help="sample segmentations as config.subword_sampling_alpha does (0 = off)")
  flags.add_argument("--skip_train_step", action="store_true",
                     help="do not time a training step for the ratio")
  args = flags.parse_args()

  import numpy as np

  from configs import multi30k
  from flax_transformer.data import pipeline as data
  from flax_transformer.data import sources
  from flax_transformer.data import tokenizer

  config = multi30k.get_config()
  pairs = sources.multi30k("train", "en", "de", manual_dir=str(MULTI30K))
  with tempfile.TemporaryDirectory() as tmp:
    start = time.time()
    tok = tokenizer.train_tokenizer(data.vocabulary_sentences(pairs, config.vocab_max_sentences),
                                    f"{tmp}/vocab.model", vocab_size=config.vocab_size)
    vocab_s = time.time() - start
  batching = data.train_batching(config, data_parallel_size=1)
  iterator = iter(data.train_dataset(
      pairs, batching, seed=0, tokenize=data.TokenizePair(tok, args.subword_sampling_alpha)))
  fractions, produced = [], []

  def run():
    tokens = 0
    for _ in range(args.batches):
      batch = next(iterator)
      fractions.append(data.nonpad_fraction(batch))
      tokens += int((batch["inputs"] != 0).sum() + (batch["targets"] != 0).sum())
    produced.append(tokens)

  seconds = timings(run, args.repeats)
  tokens_per_s = median([p / s for p, s in zip(produced[1:], seconds)])
  batch_tokens = batching.rows * (batching.max_source_length + batching.max_target_length)
  record = {"dataset": "multi30k en-de train", "tokens_per_s": tokens_per_s,
            "subword_sampling_alpha": args.subword_sampling_alpha,
            "nonpad_fraction": float(np.mean(fractions)), "batch_tokens": batch_tokens,
            "batch_shape": [batching.rows, batching.max_target_length],
            "vocab_train_s": vocab_s, "repeats": args.repeats, "batches": args.batches,
            "machine": machine()}

  if not args.skip_train_step:
    from flax_transformer.training.config_checks import model_config_from

    batch = next(iterator)
    step_s, *_ = time_train_step(model_config_from(config).replace(vocab_size=tok.vocab_size),
                                 batch, 3, config=config)
    consumed = float((np.asarray(batch["inputs"]) != 0).sum()
                     + (np.asarray(batch["targets"]) != 0).sum()) / step_s
    record.update(train_step_s=step_s, train_tokens_per_s=consumed,
                  ratio_to_training=tokens_per_s / consumed)

  print_table([record], ["dataset", "subword_sampling_alpha", "tokens_per_s", "nonpad_fraction",
                         "batch_tokens", "train_tokens_per_s", "ratio_to_training"])
  write_json(args.json, record)


if __name__ == "__main__":
  main()
