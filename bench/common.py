"""Shared by the benchmarks: timing medians, the machine's matmul peak, tables, JSON."""

from __future__ import annotations

import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))  # `configs` and `flax_transformer` from a checkout.
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def timings(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
  """Seconds per call of `fn` (which must block until its work is done)."""
  for _ in range(warmup):
    fn()
  out = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    out.append(time.perf_counter() - start)
  return out


def median(xs: Sequence[float]) -> float:
  return statistics.median(xs)


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


def run_child(command: list[str], what: str) -> dict:
  """Runs a bench's own stage in a process of its own (so that its memory is its own):
  the JSON of its last 'RESULT ' line; exits naming `what` when it fails."""
  result = subprocess.run(command, capture_output=True, text=True)
  lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
  if result.returncode != 0 or not lines:
    sys.stderr.write(result.stderr[-4000:])
    raise SystemExit(f"{what} failed (exit {result.returncode})")
  return json.loads(lines[-1][len("RESULT "):])


def random_ids(vocab: int, rows: int, length: int) -> dict:
  """A batch of random ids [rows, length] a side, no padding."""
  import numpy as np

  rng = np.random.default_rng(0)
  return {k: rng.integers(2, vocab, (rows, length), dtype=np.int32) for k in ("inputs", "targets")}


def time_train_step(model_config, batch: dict, repeats: int, warmup: int = 1, config=None):
  """Our Trainer's step (`config`, default configs/default.py; one device) on a host
  batch, as train.py compiles it: (median seconds a step, its FLOPs, compile seconds,
  the compiled executable)."""
  import jax

  from configs import default
  from flax_transformer.training import sharding
  from flax_transformer.training import steps as training

  trainer = training.Trainer(model_config, config or default.get_config(),
                             sharding.make_mesh({"data": 1}, jax.devices()[:1]))
  state = trainer.init_state(0)
  batch = jax.device_put(batch, trainer.batch_sharding)
  start = time.perf_counter()
  flops = trainer.compile_train_step(state, batch)
  compile_s = time.perf_counter() - start
  compiled = trainer._train_step.executable(state, batch)  # noqa: SLF001 (the cached one)
  holder = [state]

  def step():
    holder[0], metrics = trainer.train_step(holder[0], batch)
    jax.block_until_ready(metrics)

  return median(timings(step, repeats, warmup=warmup)), flops, compile_s, compiled


def matmul_peak_gflops(sizes=(1024, 2048), repeats: int = 5) -> float:
  """Best median GFLOP/s of a jitted float32 n x n x n matmul: the practical limit."""
  import jax
  import jax.numpy as jnp

  best = 0.0
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    f = jax.jit(jnp.matmul)
    t = median(timings(lambda: f(a, b).block_until_ready(), repeats))
    best = max(best, 2 * n ** 3 / t / 1e9)
  return best


def run_like_entry_points() -> None:
  """Re-executes with the malloc settings train.py and decode.py use (host_allocator)."""
  from flax_transformer.training import host_allocator

  host_allocator.reexec_with_reusable_malloc()


def machine() -> dict:
  import jax

  from flax_transformer import host
  from flax_transformer.training import host_allocator

  return {"python": platform.python_version(), "jax": jax.__version__,
          "platform": jax.devices()[0].platform, "devices": jax.device_count(),
          "cpu": platform.processor() or platform.machine(), **host.cpu_model(),
          "malloc": host_allocator.describe()}


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> None:
  def fmt(v):
    if isinstance(v, float):
      return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)
  cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
  print("-|-".join("-" * w for w in widths))
  for row in cells:
    print(" | ".join(v.ljust(w) for v, w in zip(row, widths)))


def write_json(path: str | None, record) -> None:
  if path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")
