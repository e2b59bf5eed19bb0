"""Shared by the benchmarks: train.py launches, timing, memory sampling; their flags,
tables and JSON records come from tools/common.py."""

from __future__ import annotations

import json
import platform
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))  # `configs`, `flax_transformer` and `tools` from a checkout.
# Stdlib only, like this module: importable under any Python (bench/pretrained_speed.py).
from tools.common import MULTI30K, parser, print_table, write_json  # noqa: E402,F401
from tools.common import command_line as bench_command  # noqa: E402,F401


def train_command(config: str, workdir, overrides: dict) -> list[str]:
  """train.py's argv: configs/`config` into `workdir`, each override as --config.KEY=VALUE."""
  return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / config),
          f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in overrides.items())]


def resumed_from(log: str) -> int | None:
  """The step a train.py log says it resumed from (None: it started afresh)."""
  found = re.search(r"Resumed from the checkpoint of step (\d+)", log)
  return int(found.group(1)) if found else None


def dir_bytes(path: Path) -> int:
  """Bytes of the files under `path`, at any depth."""
  return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def alternating(fns: dict[object, Callable[[], object]], rounds: int) -> dict[object, list[float]]:
  """Seconds of each call of each of `fns` (which must block until done), timed in turn
  round after round, so that each meets the same machine state."""
  runs = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      start = time.perf_counter()
      fn()
      runs[name].append(time.perf_counter() - start)
  return runs


def model_config(shape: dict, **overrides):
  """Our TransformerConfig at a bench's shape (vocab, d_model, d_ff, heads, layers and
  length: max_len), `overrides` its other fields."""
  from flax_transformer.network.config import TransformerConfig

  return TransformerConfig(**{
      "vocab_size": shape["vocab"], "d_model": shape["d_model"], "d_ff": shape["d_ff"],
      "num_heads": shape["heads"], "num_layers": shape["layers"], "max_len": shape["length"],
      **overrides})


def peak_rss_mb(children: bool = False) -> float:
  """Peak RSS in MiB of this process (with children=True: or of its largest waited-for child)."""
  from flax_transformer.training.progress import peak_rss_bytes

  child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 if children else 0
  return max(peak_rss_bytes(), child) / 2**20


def final_params(workdir: Path):
  """(step, parameters) of a workdir's newest checkpoint, on this process's devices."""
  from flax_transformer.averaging import load_params
  from flax_transformer.workdir import read_run

  params, (step,) = load_params(workdir, read_run(workdir)[0])
  return step, params


def same_params(a, b) -> bool:
  """Whether two parameter trees are bit for bit equal."""
  import jax
  import numpy as np

  leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(leaves_a) == len(leaves_b) and all(
      np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b))


def tree_memory(pid: int) -> dict[str, dict[str, float]]:
  """RSS, PSS and USS (private pages) in MiB of process `pid` ('main') and of each of its
  descendants ('worker N'; multiprocessing's 'resource_tracker'); {} once it has ended."""
  import psutil

  try:
    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
  except psutil.Error:
    return {}
  out, workers = {}, 0
  for p in tree:
    try:
      command, info = " ".join(p.cmdline()), p.memory_full_info()
    except psutil.Error:
      continue
    role = ("main" if p is root else "resource_tracker" if "resource_tracker" in command
            else f"worker {workers}")
    workers += role.startswith("worker")
    out[role] = {k: getattr(info, k) / 2**20 for k in ("rss", "pss", "uss")}
  return out


class TreeSampler:
  """`tree_memory(pid)` every `every_s` seconds in a thread, from now until the process
  ends or stop(): `samples`, one {role: {rss, pss, uss}} each."""

  def __init__(self, pid: int, every_s: float):
    self.pid, self.samples, self._done = pid, [], threading.Event()
    self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
    self._thread.start()

  def _run(self, every_s: float) -> None:
    while (sample := tree_memory(self.pid)):
      self.samples.append(sample)
      if self._done.wait(every_s):
        return

  def stop(self) -> list[dict]:
    """The samples, one more taken now if the process still runs."""
    self._done.set()
    self._thread.join()
    if (sample := tree_memory(self.pid)):
      self.samples.append(sample)
    return self.samples


def run_child(command: list[str], what: str, env: dict | None = None) -> dict:
  """Runs a bench's own stage in a process of its own (so that its memory is its own):
  the JSON of its last 'RESULT ' line; exits naming `what` when it fails."""
  result = subprocess.run(command, capture_output=True, text=True, env=env)
  lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
  if result.returncode != 0 or not lines:
    sys.stderr.write(result.stderr[-4000:])
    raise SystemExit(f"{what} failed (exit {result.returncode})")
  return json.loads(lines[-1][len("RESULT "):])


def run_script(python: str, *args) -> str:
  """`python script args...` in the checkout; its stderr (the log), or exits naming it."""
  done = subprocess.run([python, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
  if done.returncode:
    sys.stderr.write(done.stderr[-4000:])
    raise SystemExit(f"{args[0]} failed (exit {done.returncode})")
  return done.stderr


def random_ids(vocab: int, rows: int, length: int) -> dict:
  """A batch of random ids [rows, length] a side, no padding."""
  import numpy as np

  rng = np.random.default_rng(0)
  return {k: rng.integers(2, vocab, (rows, length), dtype=np.int32) for k in ("inputs", "targets")}


def machine() -> dict:
  """Python and jax versions, jax's devices, the host (`host.describe`) and its malloc."""
  import jax

  from flax_transformer import host
  from flax_transformer import host_allocator

  return {"python": platform.python_version(), "jax": jax.__version__,
          "platform": jax.devices()[0].platform, "devices": jax.device_count(),
          **host.describe(), "malloc": host_allocator.describe()}
