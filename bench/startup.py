"""Seconds from a train.py launch to its first step, cold compilation cache, for one or
more checkouts measured in turn (one round runs each checkout once; rounds repeat).

python bench/startup.py --roots=OLD_CHECKOUT,. [--config=configs/multi30k.py]
    [--rounds 3] [--out results/bench/startup.json]
Each launch trains `--steps` steps (one log line) in a new workdir with a new cache, on
one CPU device, from Multi30k; its log's timestamps give the setup, each compile and the
first logged step, relative to the process start. Medians per checkout, and the ratio of
each checkout's median to the first's, measured in the same run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from common import MULTI30K, median, print_table, write_json

# absl's log prefix: I1127 22:15:20.476074 ...
STAMP = re.compile(r"^[IWE]\d{4} (\d\d:\d\d:\d\d\.\d+) .*?\] (.*)$")
EVENTS = {"first_batch": "First training batch on the devices",
          "train_step_compiled": "Train step for batch",
          "init_compiled": "Parameter initialisation",
          "first_step_logged": "step "}


def launch(root: Path, config: str, steps: int) -> dict:
  """One cold launch of `root`'s train.py: seconds from the start to each event."""
  with tempfile.TemporaryDirectory() as scratch:
    started = time.time()
    done = subprocess.run(
        [sys.executable, str(root / "train.py"), f"--config={root / config}",
         f"--workdir={scratch}/w", f"--config.manual_dir={MULTI30K}",
         f"--config.compilation_cache_dir={scratch}/cache", f"--config.num_train_steps={steps}",
         f"--config.log_every_steps={steps}", f"--config.eval_every_steps={steps}",
         "--config.bleu_every_steps=0", f"--config.checkpoint_every_steps={steps}"],
        cwd=root, capture_output=True, text=True, env={"XLA_FLAGS": "", "PATH": "/usr/bin"})
    wall = time.time() - started
  if done.returncode:
    sys.exit(f"{root}: train.py failed:\n{done.stderr[-2000:]}")
  day = datetime.fromtimestamp(started).date()
  out = {"wall_s": wall}
  for line in done.stderr.splitlines():
    match = STAMP.match(line)
    if not match:
      continue
    at = datetime.combine(day, datetime.strptime(match[1], "%H:%M:%S.%f").time())
    for event, text in EVENTS.items():
      if event not in out and match[2].startswith(text):
        out[event] = at.timestamp() - started
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--roots", required=True, help="comma-separated checkouts")
  parser.add_argument("--config", default="configs/multi30k.py")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  roots = [Path(r).resolve() for r in args.roots.split(",")]
  runs = {str(r): [] for r in roots}
  for _ in range(args.rounds):
    for root in roots:
      runs[str(root)].append(launch(root, args.config, args.steps))
  rows = []
  for root in roots:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                            capture_output=True, text=True).stdout.strip()
    row = {"root": str(root), "commit": commit}
    for event in ("wall_s", *EVENTS):
      row[event] = median([r[event] for r in runs[str(root)] if event in r])
    rows.append(row)
  for row in rows[1:]:
    row["first_step_ratio"] = row["first_step_logged"] / rows[0]["first_step_logged"]
  print_table(rows, ["commit", *EVENTS, "wall_s", "first_step_ratio"])
  write_json(args.out, {"command": " ".join(sys.argv), "config": args.config,
                        "steps": args.steps, "rounds": args.rounds, "medians": rows,
                        "runs": runs})


if __name__ == "__main__":
  main()
