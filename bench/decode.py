"""Beam search speed: sentences/s and tokens/s, beam 4, alpha 0.6.

python bench/decode.py [--workdir DIR] [--json PATH] [--repeats 5]
1. 'small-random' (vocab 8000, d_model 256, 3+3 layers, 4 heads, d_ff 1024, random
   weights, 8 sources x 32 tokens, 63 steps): a plain cached beam search (a cache row
   per beam, gathered after every step) and ours (`share_beam_cache`: a sentence's
   beams share one row, read through a mask), each on one CPU device and split over
   one device per core (`programs.shard_search_fn`), timed alternately; same outputs
   checked.
2. With --workdir: the trained model over Multi30k test 2016 (1000 sentences), on
   one device and on one device per core.
Its --first_call section retired (last at 3a5fe08; results/bench/RETIRED.md).
"""

from __future__ import annotations

from statistics import median

from common import MULTI30K, alternating, bench_command, machine, parser, print_table, write_json

CACHES = {  # name -> TransformerConfig.share_beam_cache
    "plain cached beam search": False,  # A cache row per beam, gathered every step.
    "shared beam cache (ours)": True,
}


def random_model_rows(repeats: int) -> list[dict]:
  """Both cache variants on one device and on all devices, timed alternately."""
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from flax_transformer import Transformer, TransformerConfig
  from flax_transformer.translation.search_config import SearchConfig
  from flax_transformer.translation.programs import make_search_fn, shard_search_fn

  config = TransformerConfig(vocab_size=8000, d_model=256, d_ff=1024, num_heads=4,
                             num_layers=3, max_len=64, deterministic=True)
  inputs = np.random.default_rng(0).integers(2, 8000, (8, 32)).astype(np.int32)
  params = Transformer(config).init(jax.random.PRNGKey(0), inputs[:1], inputs[:1])["params"]
  key = jax.random.PRNGKey(0)
  searches, outputs = {}, {}
  for devices in sorted({1, jax.device_count()}):
    mesh = Mesh(np.asarray(jax.devices()[:devices]), ("rows",))
    placed = (jax.device_put(params, NamedSharding(mesh, PartitionSpec())),
              jax.device_put(inputs, NamedSharding(mesh, PartitionSpec("rows"))))
    for name, shared in CACHES.items():
      # max_extra 31: up to 63 steps, and a random model rarely ends a sentence early.
      fn = make_search_fn(config.replace(share_beam_cache=shared),
                          SearchConfig(beam_size=4, alpha=0.6, max_extra=31))
      search = jax.jit(shard_search_fn(fn, mesh))
      row = (name, devices)
      searches[row] = lambda search=search, placed=placed: jax.block_until_ready(
          search(*placed, key))
      outputs[row] = searches[row]()  # Also the warm-up.
  times = alternating(searches, repeats)  # So that all meet the same machine load.
  rows = []
  plain = min(median(times[row]) for row in searches if not CACHES[row[0]])
  first = outputs[next(iter(outputs))].sequences
  for (name, devices), out in outputs.items():
    seconds = median(times[name, devices])
    lengths = (np.asarray(out.sequences[:, 0]) != 0).sum()
    rows.append({"model": f"small-random, {name}", "devices": devices, "batch": 8,
                 "beam_size": 4, "s_per_batch": seconds, "sentences_per_s": 8 / seconds,
                 "tokens_per_s": float(lengths) / seconds, "runs_s": times[name, devices],
                 "same_output_as_plain": bool(np.array_equal(out.sequences, first)),
                 # Against the faster plain search of the run (on 1 device or split).
                 "speedup_vs_plain": plain / seconds})
  return rows


def trained_model_rows(workdir: str, repeats: int) -> list[dict]:
  import jax
  import numpy as np

  from flax_transformer.data.sources import read_lines
  from flax_transformer.translation.search_config import SearchConfig
  from flax_transformer.translation.translator import Translator

  sentences = read_lines(MULTI30K / "test_2016_flickr.en.gz")
  translators = {n: Translator.from_workdir(workdir,
                                            search=SearchConfig(beam_size=4, alpha=0.6),
                                            devices=jax.devices()[:n])
                 for n in sorted({1, jax.device_count()})}
  # The first translation compiles every batch shape.
  outputs = {n: [t.translate(sentences)] for n, t in translators.items()}
  times = alternating({n: lambda n=n, t=t: outputs[n].append(t.translate(sentences))
                       for n, t in translators.items()}, repeats)
  rows = []
  for n, translator in translators.items():
    seconds, texts = median(times[n]), outputs[n][-1]
    tokens = [len(translator.tokenizer.tokenize(t)) for t in texts]
    rows.append({"model": f"trained ({workdir})", "devices": n,
                 "batch": translator.batch_tokens, "beam_size": 4, "s_per_batch": float("nan"),
                 "sentences_per_s": len(sentences) / seconds, "tokens_per_s": sum(tokens) / seconds,
                 "sentences": len(sentences), "mean_output_tokens": float(np.mean(tokens)),
                 "runs_s": times[n], "same_output_as_one_device": texts == outputs[1][-1]})
  return rows


def main():
  flags = parser(__doc__)
  flags.add_argument("--workdir", help="a trained Multi30k workdir (adds its rows)")
  flags.add_argument("--repeats", type=int, default=5, help="timed runs (median reported)")
  flags.add_argument("--cpu_devices", type=int, default=0,
                     help="CPU devices to split over (0 = one per core), as decode.py")
  args = flags.parse_args()
  from flax_transformer import host_allocator

  # The malloc settings train.py and decode.py use; before JAX loads, as they do.
  host_allocator.reexec_with_reusable_malloc()
  from flax_transformer.cli import common as cli

  cli.set_cpu_devices(args.cpu_devices)
  rows = random_model_rows(args.repeats)
  ours = min((r for r in rows if "ours" in r["model"]), key=lambda r: r["s_per_batch"])
  plain = min((r for r in rows if "plain" in r["model"]), key=lambda r: r["s_per_batch"])
  if args.workdir:
    rows += trained_model_rows(args.workdir, max(1, args.repeats // 2))
  print_table(rows, ["model", "devices", "batch", "beam_size", "s_per_batch", "sentences_per_s",
                     "tokens_per_s", "speedup_vs_plain"])
  # The headline: the faster of ours against the faster plain search, same run.
  record = {**ours, "plain_s_per_batch": plain["s_per_batch"], "plain_devices": plain["devices"],
            "rows": rows, "machine": machine(), "command": bench_command()}
  write_json(args.json, record)


if __name__ == "__main__":
  main()
