"""SIGTERM to process gone: train.py on the README config and the tiny one, this checkout
and a baseline commit in turn (issue 68 section 3: a stop that meets a preemption notice).

python bench/stop.py [--baseline 726c415] [--configs multi30k.py tiny.py] [--rounds 1]
                     [--json results/bench/stop.json]

Each launch trains without evaluations or periodic checkpoints, logging every 50 steps
(the README config's cadence; 200 for the tiny config's ~50x shorter steps); SIGTERM
comes 20 s (tiny: 2 s) after its first log line, mid-interval. Recorded from its
stderr, as the lines arrive: the step time of that first interval, the step the loop
stopped at and the seconds from the signal to the "Stopped by SIGTERM" line (the steps
dispatched ahead of the devices run first), to the process gone (the last checkpoint
written, the input pipeline and everything else closed) and their sum in step times.
"""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from common import MULTI30K, ROOT, bench_command, parser, print_table, train_command, write_json

STEP = re.compile(r"step (\d+)/\d+ .*\| ([0-9.]+) s/step")
STOPPED = re.compile(r"Stopped by SIGTERM at step (\d+)")


def launch(root: Path, config: str, workdir: Path, args, vocab: Path | None) -> dict:
  """One train.py launch from checkout `root`, stopped by SIGTERM; what it took."""
  overrides = {"manual_dir": MULTI30K, "compilation_cache_dir": args.cache,
               "num_train_steps": 100000, "eval_every_steps": 100000, "bleu_every_steps": 0,
               "checkpoint_every_steps": 100000, "log_every_steps": args.log_every[config]}
  if vocab and vocab.exists():
    overrides["vocab_path"] = vocab
  command = train_command(config, workdir, overrides)
  command[1] = str(root / "train.py")
  command[3] = str(root / "configs" / config)
  process = subprocess.Popen(command, cwd=root, stderr=subprocess.PIPE, text=True)
  times, logged, record = {}, [], {}

  def terminate():
    times["signal"] = time.monotonic()
    process.send_signal(signal.SIGTERM)

  for line in process.stderr:
    if (step := STEP.search(line)) and "signal" not in times:
      logged.append((int(step[1]), float(step[2])))
      if len(logged) == 1:
        record["signalled_after_step"] = logged[-1][0]
        record["step_s"] = logged[-1][1]
        threading.Timer(args.signal_after[config], terminate).start()
    elif stopped := STOPPED.search(line):
      times["stopped"], record["stopped_at_step"] = time.monotonic(), int(stopped[1])
  process.wait()
  gone = time.monotonic()
  if "stopped" not in times:
    raise SystemExit(f"{config} from {root}: no 'Stopped by SIGTERM' line (exit "
                     f"{process.returncode})")
  record.update(exit_code=process.returncode,
                signal_to_stopped_s=times["stopped"] - times["signal"],
                stopped_to_gone_s=gone - times["stopped"],
                signal_to_gone_s=gone - times["signal"])
  record["signal_to_gone_steps"] = record["signal_to_gone_s"] / record["step_s"]
  return record


def main() -> None:
  flags = parser(__doc__)
  flags.add_argument("--baseline", default="726c415")
  flags.add_argument("--configs", nargs="+", default=["multi30k.py", "tiny.py"])
  flags.add_argument("--rounds", type=int, default=1)
  args = flags.parse_args()
  # The README config logs every 50 steps; the tiny one's steps are ~50x shorter.
  args.log_every = {"multi30k.py": 50, "tiny.py": 200}
  args.signal_after = {"multi30k.py": 20.0, "tiny.py": 2.0}
  scratch = Path(tempfile.mkdtemp(prefix="bench_stop_"))
  args.cache = scratch / "xla_cache"
  baseline = scratch / "baseline"
  baseline.mkdir()
  archive = subprocess.run(["git", "archive", args.baseline], cwd=ROOT, check=True,
                           capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
  rows = []
  for config in args.configs:
    vocab = scratch / f"{config}.vocab.model"
    for round_ in range(args.rounds):
      for name, root in (("baseline " + args.baseline, baseline), ("this checkout", ROOT)):
        workdir = scratch / f"{config}_{round_}_{name.split()[0]}"
        row = {"config": config, "checkout": name, "round": round_,
               **launch(root, config, workdir, args, vocab)}
        if not vocab.exists():
          vocab.write_bytes((workdir / "vocab.model").read_bytes())  # Reused by the rest.
        rows.append(row)
        print_table([row], list(row))
  columns = ["config", "checkout", "step_s", "signalled_after_step", "stopped_at_step",
             "signal_to_stopped_s", "stopped_to_gone_s", "signal_to_gone_s",
             "signal_to_gone_steps"]
  print_table(rows, columns)
  summary = {f"{config} {name}": {k: statistics.median(r[k] for r in rows
                                                        if (r["config"], r["checkout"])
                                                        == (config, name))
                                  for k in columns[2:]}
             for config in args.configs for name in ("baseline " + args.baseline,
                                                      "this checkout")}
  write_json(args.json, {"command": bench_command(), "rows": rows, "median": summary})


if __name__ == "__main__":
  main()
