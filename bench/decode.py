"""Beam search speed: sentences/s and tokens/s, beam 4, alpha 0.6.

python bench/decode.py [--workdir DIR] [--json PATH] [--repeats 5]
1. 'small-random': vocab 8000, d_model 256, 3+3 layers, 4 heads, d_ff 1024, random
   weights, 8 sources x 32 tokens, 63 decoding steps (the reference point's shape),
   twice in the same run: a plain cached beam search (each beam its own cache row,
   reordered by a gather after every step, encoder-decoder keys/values per beam, as
   most implementations do) and ours (`share_beam_cache`: a sentence's beams share
   one cache row, self-attention entries stay where they were written and each beam
   reads its history through a mask); same outputs checked.
2. With --workdir: the trained model over Multi30k test 2016 (1000 sentences).
"""

from __future__ import annotations

import argparse
import gzip

from common import MULTI30K, machine, median, print_table, run_like_entry_points, timings, \
    write_json


def random_model_rows(repeats: int) -> list[dict]:
  """Both cache variants on the same random model, timed alternately."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from flax_transformer import Transformer, TransformerConfig
  from flax_transformer.translator import SearchConfig, make_search_fn

  config = TransformerConfig(vocab_size=8000, d_model=256, d_ff=1024, num_heads=4,
                             num_layers=3, max_len=64, deterministic=True)
  inputs = jnp.asarray(np.random.default_rng(0).integers(2, 8000, (8, 32)).astype(np.int32))
  params = Transformer(config).init(jax.random.PRNGKey(0), inputs[:1], inputs[:1])["params"]
  key = jax.random.PRNGKey(0)
  variants = {  # name -> TransformerConfig.share_beam_cache
      "plain cached beam search": False,  # A cache row per beam, gathered every step.
      "shared beam cache (ours)": True,
  }
  searches, times, outputs = {}, {name: [] for name in variants}, {}
  for name, shared in variants.items():
    # max_extra 31: up to 63 steps, and a random model rarely ends a sentence early.
    fn = make_search_fn(config.replace(share_beam_cache=shared),
                        SearchConfig(beam_size=4, alpha=0.6, max_extra=31))
    searches[name] = jax.jit(fn)
    outputs[name] = jax.block_until_ready(searches[name](params, inputs, key))
  for _ in range(repeats):  # Alternating, so both see the same machine load.
    for name, search in searches.items():
      times[name] += timings(lambda: jax.block_until_ready(search(params, inputs, key)), 1,
                             warmup=0)
  rows = []
  for name in variants:
    out, seconds = outputs[name], median(times[name])
    lengths = (np.asarray(out.sequences[:, 0]) != 0).sum()
    rows.append({"model": f"small-random, {name}", "batch": 8, "beam_size": 4,
                 "s_per_batch": seconds, "sentences_per_s": 8 / seconds,
                 "tokens_per_s": float(lengths) / seconds, "runs_s": times[name]})
  base, cached = (outputs[name] for name in variants)
  rows[1]["same_output_as_plain"] = bool(np.array_equal(base.sequences, cached.sequences))
  rows[1]["speedup_vs_plain"] = rows[0]["s_per_batch"] / rows[1]["s_per_batch"]
  return rows


def trained_model_row(workdir: str, repeats: int) -> dict:
  import numpy as np

  from flax_transformer.translator import Translator

  with gzip.open(MULTI30K / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
    sentences = [line.rstrip("\n") for line in f]
  translator = Translator.from_workdir(workdir, beam_size=4, alpha=0.6)
  translator.translate(sentences[:64])  # Compile the common shapes.
  outputs = []
  seconds = median(timings(lambda: outputs.append(translator.translate(sentences)), repeats,
                           warmup=0))
  tokens = sum(len(translator.tokenizer.tokenize(t)) for t in outputs[-1])
  return {"model": f"trained ({workdir})", "batch": translator.batch_tokens, "beam_size": 4,
          "s_per_batch": float("nan"), "sentences_per_s": len(sentences) / seconds,
          "tokens_per_s": tokens / seconds, "sentences": len(sentences),
          "mean_output_tokens": float(np.mean([len(translator.tokenizer.tokenize(t))
                                               for t in outputs[-1]]))}


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--workdir", help="a trained Multi30k workdir (adds the second row)")
  parser.add_argument("--json", help="write the results here")
  parser.add_argument("--repeats", type=int, default=5, help="timed runs (median reported)")
  args = parser.parse_args()
  run_like_entry_points()
  rows = random_model_rows(args.repeats)
  if args.workdir:
    rows.append(trained_model_row(args.workdir, max(1, args.repeats // 2)))
  print_table(rows, ["model", "batch", "beam_size", "s_per_batch", "sentences_per_s",
                     "tokens_per_s", "speedup_vs_plain"])
  record = {**rows[1], "plain_s_per_batch": rows[0]["s_per_batch"], "rows": rows,
            "machine": machine()}
  write_json(args.json, record)


if __name__ == "__main__":
  main()
