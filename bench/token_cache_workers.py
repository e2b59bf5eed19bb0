"""Memory of the training input path with worker processes over the token cache.

python bench/token_cache_workers.py --scratch /tmp/ws [--workers 8] [--old_workers 2]
    [--seconds 60] [--json results/bench/token_cache_workers.json]

--scratch: bench/wmt_scale.py's folder (its stages generate prepare vocab tokens: the
4.5M-pair WMT-shaped corpus, its vocabulary and token cache). The training pipeline is
built as loop.setup_run builds it (data.pipeline.train_dataset over the token cache,
prefetched(workers=N): grain's mp_prefetch), batches are drawn for --seconds, and the
memory of every process of the tree (this one and its workers) is read from
/proc/PID/smaps_rollup every second:

  RSS  resident pages, file-backed shared ones included: every worker that reads the
       memory-mapped ids counts those pages again, though the host holds them once
       (in the page cache);
  PSS  each shared page divided among the processes mapping it: the tree's PSS sum is
       what it really holds;
  USS  private pages (Private_Clean + Private_Dirty): what one more worker adds.
The issue's aim (each worker adds at most 150 MB) is judged on the workers' USS.

Variants, each in a process of its own: `new` (TokenizedPairs as it is: pickled as
its folder, each worker maps the files) and `old` (the same class pickled with its
arrays, as before issue 57: each worker gets a private copy of every id), the old one
with --old_workers (default 2: its per-worker copy is the figure, 8 copies would take
GBs of this shared host). Also the size and time of pickling the dataset once.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

from common import TreeSampler, bench_command, dir_bytes, parser, print_table, run_child, \
    write_json

def measure(args) -> dict:
  """One variant in this process: the pipeline, batches for --seconds, the tree's memory."""
  from absl import flags

  flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags.
  import wmt_scale
  from flax_transformer.data import pipeline as data
  from flax_transformer.data import token_cache

  config, pairs, tokenizer = wmt_scale._open(args)  # noqa: SLF001 (the bench's own opener)
  ids = token_cache.load_or_build(pairs, tokenizer, config.token_cache_dir)  # As training_ids does.
  if args.variant == "old":
    ids = PickledWithItsArrays(ids.folder)
  start = time.perf_counter()
  pickle_bytes = len(pickle.dumps(ids))  # Not kept: the main process's memory is measured.
  pickle_s = time.perf_counter() - start
  batching = data.train_batching(config, data_parallel_size=1)
  dataset = data.train_dataset(ids, batching, seed=config.seed)
  start = time.perf_counter()
  iterator = iter(data.prefetched(dataset, lambda b: b, workers=args.workers, device_buffer=0))
  next(iterator)
  first_batch_s = time.perf_counter() - start
  batches, tokens = 0, 0
  sampler, start = TreeSampler(os.getpid(), every_s=1.0), time.perf_counter()
  while time.perf_counter() - start < args.seconds:
    batch = next(iterator)
    batches += 1
    tokens += int((batch["inputs"] != 0).sum() + (batch["targets"] != 0).sum())
  samples = sampler.stop()
  peak = {}  # Per process and figure, the largest sampled value.
  for sample in samples:
    for role, figures in sample.items():
      for k, v in figures.items():
        peak.setdefault(role, {})[k] = max(peak.get(role, {}).get(k, 0.0), v)
  workers = [v for role, v in peak.items() if role.startswith("worker")]
  return {"variant": args.variant, "workers": args.workers, "pairs": len(ids),
          "token_cache_bytes": dir_bytes(ids.folder),
          "pickle_bytes": pickle_bytes, "pickle_s": pickle_s, "first_batch_s": first_batch_s,
          "batches": batches, "seconds": args.seconds, "real_tokens_per_s": tokens / args.seconds,
          "batch_shape": [batching.rows, batching.max_target_length],
          "samples": len(samples), "peak_mb": peak, "last_mb": samples[-1],
          "worker_uss_mb_max": max(w["uss"] for w in workers) if workers else None,
          "worker_pss_mb_max": max(w["pss"] for w in workers) if workers else None,
          "worker_rss_mb_max": max(w["rss"] for w in workers) if workers else None,
          "tree_pss_mb": sum(v["pss"] for v in samples[-1].values()),
          "tree_rss_mb": sum(v["rss"] for v in samples[-1].values())}


from flax_transformer.data.token_cache import TokenizedPairs  # noqa: E402


class PickledWithItsArrays(TokenizedPairs):
  """TokenizedPairs pickled as before issue 57: with its arrays (the memory-mapped ids
  and the offsets), so that every worker unpickles a private copy of them."""

  def __getstate__(self):
    return dict(self.__dict__)

  def __setstate__(self, state):
    self.__dict__.update(state)


def main():
  flags = parser(__doc__)
  flags.add_argument("--scratch", type=Path, required=True,
                     help="bench/wmt_scale.py's folder, its stages up to tokens done")
  flags.add_argument("--workers", type=int, default=8, help="input workers (new variant)")
  flags.add_argument("--old_workers", type=int, default=2,
                     help="input workers of the old variant (0: skip it)")
  flags.add_argument("--seconds", type=float, default=60, help="batches drawn this long")
  flags.add_argument("--variant", choices=["new", "old"], help="(one variant's own process)")
  args = flags.parse_args()
  args.scratch = args.scratch.resolve()
  if args.variant:
    print("RESULT " + json.dumps(measure(args)), flush=True)
    return

  records = []
  for variant, workers in (("new", args.workers), ("old", args.old_workers)):
    if workers <= 0:
      continue
    command = [sys.executable, __file__, "--variant", variant, "--scratch", str(args.scratch),
               "--workers", str(workers), "--seconds", str(args.seconds)]
    print(f"{variant}: {workers} worker(s) ...", flush=True)
    records.append(run_child(command, f"variant {variant}"))

  rows = []
  for r in records:
    for role, m in r["peak_mb"].items():
      rows.append({"variant": r["variant"], "process": role, "rss_mb": m["rss"],
                   "pss_mb": m["pss"], "uss_mb": m["uss"]})
  print_table(rows, ["variant", "process", "rss_mb", "pss_mb", "uss_mb"])
  print()
  print_table([{k: r[k] for k in ("variant", "workers", "pairs", "pickle_bytes", "pickle_s",
                                  "first_batch_s", "worker_uss_mb_max", "tree_pss_mb",
                                  "tree_rss_mb", "real_tokens_per_s")} for r in records],
              ["variant", "workers", "pairs", "pickle_bytes", "pickle_s", "first_batch_s",
               "worker_uss_mb_max", "tree_pss_mb", "tree_rss_mb", "real_tokens_per_s"])
  from flax_transformer import provenance

  code = provenance.git_commit()
  aim_mb = 150
  new = next((r for r in records if r["variant"] == "new"), None)
  write_json(args.json, {
      "command": bench_command(),
      "commit": code.get("git_commit"), "git_dirty": code.get("git_dirty"),
      "cores": os.cpu_count(), "aim_worker_uss_mb": aim_mb,
      "aim_met": bool(new and new["worker_uss_mb_max"] <= aim_mb),
      "judged_on": "each worker's USS (private pages): the memory-mapped ids are file-backed "
                   "shared pages, in every process's RSS but held once by the host",
      "variants": records})


if __name__ == "__main__":
  main()
