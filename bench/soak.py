"""A scale soak: train.py on the 4.5M-pair synthetic WMT corpus, killed once, resumed, finished.

python bench/soak.py --scratch /tmp/ws [--steps 300] [--kill_at 150] [--workers -1 8]
                     [--json results/bench/soak.json]

--scratch is bench/wmt_scale.py's folder (`data/`, `vocab.model`, `tokens/`: the token
cache, built by the first launch if missing). Per worker count, a small model
(configs/tiny.py's shape, the corpus's 37k vocabulary, 64-token rows) is trained:
  reference   --steps steps, start to end, in its own workdir;
  killed      the same command in a second workdir, `kill -9` once the checkpoint of
              --kill_at is complete;
  resumed     the same command again in that workdir, to the end.
Each launch's process tree (train.py and its input workers) is sampled every 0.25 s
for its summed RSS and PSS (the memory-mapped token cache counts once in PSS, in each
process in RSS); first batch: the log's "First training batch" line. Exact: the
resumed run's final parameters equal the reference's, bit for bit.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from common import TreeSampler, bench_command, final_params, parser, print_table, resumed_from, \
    same_params, train_command, write_json

import psutil


def command(args, workdir: Path, workers: int) -> list[str]:
  scratch = args.scratch
  return train_command("tiny.py", workdir, {
      "dataset_name": "wmt14_translate/de-en", "data_dir": scratch / "data", "manual_dir": "",
      "vocab_path": scratch / "vocab.model", "token_cache_dir": scratch / "tokens",
      "eval_dataset_name": "", "model.max_len": 64, "max_source_length": 64,
      "max_target_length": 64, "batch_tokens": 2048, "num_train_steps": args.steps,
      "log_every_steps": 50, "checkpoint_every_steps": 50, "eval_every_steps": 100000,
      "num_eval_steps": 1, "bleu_every_steps": 0, "data_workers": workers})


def peaks(samples: list[dict]) -> dict:
  """The largest summed RSS and PSS (MiB) of the process tree, its main process's RSS,
  and the most processes it had, over `samples` (TreeSampler's)."""
  largest = lambda f: max((f(tree) for tree in samples), default=0.0)  # noqa: E731
  return {"peak_tree_rss_mb": largest(lambda t: sum(m["rss"] for m in t.values())),
          "peak_tree_pss_mb": largest(lambda t: sum(m["pss"] for m in t.values())),
          "peak_main_rss_mb": largest(lambda t: t.get("main", {}).get("rss", 0.0)),
          "processes": largest(len) or 0}


FIRST_BATCH = re.compile(r"First training batch .* in ([0-9.]+) s")


def launch(args, workdir: Path, workers: int, log: Path, kill_at: int | None = None) -> dict:
  """One train.py launch; with kill_at, SIGKILL once that step's checkpoint is complete."""
  start = time.time()
  with open(log, "w") as out:
    process = subprocess.Popen(command(args, workdir, workers), stdout=out,
                               stderr=subprocess.STDOUT, env=dict(os.environ, XLA_FLAGS=""))
    sampler = TreeSampler(process.pid, every_s=0.25)
    if kill_at is not None:
      while not (workdir / "checkpoints" / str(kill_at) / "_CHECKPOINT_METADATA").exists():
        if process.poll() is not None:
          raise SystemExit(f"{log}: ended (exit {process.returncode}) before step {kill_at}")
        time.sleep(0.2)
      for child in psutil.Process(process.pid).children(recursive=True):
        child.kill()  # As a machine's loss takes the workers too.
      process.send_signal(signal.SIGKILL)
    code = process.wait()
  record = {"returncode": code, "wall_s": time.time() - start, **peaks(sampler.stop()),
            "log": str(log)}
  found = FIRST_BATCH.search(log.read_text())
  record["first_batch_s"] = float(found.group(1)) if found else None
  if kill_at is None and code != 0:
    raise SystemExit(f"{log}: exit {code}\n" + log.read_text()[-3000:])
  return record


def soak(args, workers: int) -> dict:
  base = args.scratch / f"soak_workers{workers}"
  shutil.rmtree(base, ignore_errors=True)
  base.mkdir(parents=True)
  runs = {"reference": launch(args, base / "reference", workers, base / "reference.log")}
  runs["killed"] = launch(args, base / "interrupted", workers, base / "killed.log",
                          kill_at=args.kill_at)
  runs["resumed"] = launch(args, base / "interrupted", workers, base / "resumed.log")
  (step_a, a), (step_b, b) = final_params(base / "reference"), final_params(base / "interrupted")
  return {"workers": workers, "runs": runs,
          "resumed_from_step": resumed_from((base / "resumed.log").read_text()),
          "bit_exact": step_a == step_b and same_params(a, b)}


def main():
  flags = parser(__doc__)
  flags.add_argument("--scratch", type=Path, required=True,
                     help="bench/wmt_scale.py's folder (data/, vocab.model, tokens/)")
  flags.add_argument("--steps", type=int, default=300)
  flags.add_argument("--kill_at", type=int, default=150, help="a multiple of 50")
  flags.add_argument("--workers", type=int, nargs="+", default=[-1],
                     help="config.data_workers of each soak (-1: the default, automatic)")
  args = flags.parse_args()
  for needed in ("data", "vocab.model"):
    if not (args.scratch / needed).exists():
      raise SystemExit(f"{args.scratch / needed} missing: run bench/wmt_scale.py --scratch "
                       f"{args.scratch} --stages generate prepare vocab first")

  from flax_transformer import provenance
  from flax_transformer.data import pipeline

  results = [soak(args, w) for w in args.workers]
  rows = []
  for result in results:
    for name, run in result["runs"].items():
      rows.append({"workers": result["workers"], "launch": name,
                   "first batch s": run["first_batch_s"], "wall s": run["wall_s"],
                   "processes": run["processes"], "peak tree RSS MB": run["peak_tree_rss_mb"],
                   "peak tree PSS MB": run["peak_tree_pss_mb"],
                   "bit-exact": result["bit_exact"] if name == "resumed" else ""})
  print_table(rows, list(rows[0]))
  write_json(args.json, {
      "command": bench_command(),
      "train_command": " ".join(command(args, Path("WORKDIR"), -1)[1:]),
      "auto_workers_here": pipeline.auto_workers(-1), "cores": os.cpu_count(),
      "steps": args.steps, "kill_at": args.kill_at, "soaks": results, **provenance.commit()})


if __name__ == "__main__":
  main()
