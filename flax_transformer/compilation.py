"""XLA compilation: the persistent cache, and every compile logged once with its time.

A cold compile on a GPU is dominated by XLA's autotuning (seconds per matmul
shape). jax's persistent cache stores each compiled executable, and with it the
per-fusion autotuning results (`jax_persistent_cache_enable_xla_caches`), so a
second launch of the same job loads instead of compiling.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
from jax.experimental.compilation_cache import compilation_cache

# Smaller programs than this are not worth a file (jax's default is 1 s, which would
# leave out the CPU eval and search steps that tests and small runs compile).
MIN_COMPILE_SECONDS = 0.2


# XLA flags train.py and decode.py set unless XLA_FLAGS already names them: flag ->
# value. cuBLAS-only matmuls on GPUs: on an H100 our train step compiled and ran
# faster without Triton GEMM autotuning, at a small shape and the paper's base one
# (results/device_runs/2026-11-26_h100_run1/README.md, runs 3 and 4). No effect on CPUs and TPUs.
DEFAULT_XLA_FLAGS = {"--xla_gpu_enable_triton_gemm": "false"}


def set_default_xla_flags(environ=os.environ) -> list[str]:
  """Adds DEFAULT_XLA_FLAGS to XLA_FLAGS (before JAX starts its backends); returns those added.

  A flag already in XLA_FLAGS, with any value, is left as the user set it.
  """
  current = environ.get("XLA_FLAGS", "")
  given = {part.split("=", 1)[0] for part in current.split()}
  added = [f"{flag}={value}" for flag, value in DEFAULT_XLA_FLAGS.items() if flag not in given]
  if added:
    environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
  return added


def default_cache_dir() -> str:
  """$XDG_CACHE_HOME/flax_transformer/xla (~/.cache/... when unset)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "flax_transformer", "xla")


_cache_dir: str | None = None


def enable_cache(directory: str, max_bytes: int = 0) -> str | None:
  """Turns on jax's persistent compilation cache in `directory` ('' = off).

  `max_bytes` > 0 caps the directory's entries: beyond, jax deletes the least
  recently used (its LRU cache, which needs `filelock`; it cannot evict, and so
  writes nothing, while the folder holds an entry an uncapped process wrote: give a
  capped cache a folder of its own). Compiles before this call are not cached (jax
  decides once whether to use its cache, so the decision is reset here). Returns the
  directory in use, or None.
  """
  global _cache_dir
  if not directory:
    return None
  path = str(Path(directory).expanduser().resolve())
  if _cache_dir == path:
    return path
  Path(path).mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_max_size", max_bytes if max_bytes > 0 else -1)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  compilation_cache.reset_cache()  # jax may have settled on "no cache" at an earlier compile.
  _cache_dir = path
  logging.info("XLA compilation cache: %s (%d entries)", path, cache_entries(path))
  return path


def cache_bytes(directory: str) -> int:
  """Bytes of the compiled executables stored in a cache directory and its subdirectories."""
  return sum(p.stat().st_size for p in Path(directory).rglob("*-cache"))


def cache_entries(directory: str) -> int:
  """Compiled executables stored in a cache directory."""
  path = Path(directory)
  return sum(1 for p in path.iterdir() if p.is_file()) if path.is_dir() else 0


class _CacheHits:
  """Counts jax's persistent-cache hits (a jax.monitoring listener, registered once)."""

  def __init__(self):
    self.hits = 0
    self._lock = threading.Lock()
    jax.monitoring.register_event_listener(self._on_event)

  def _on_event(self, event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
      with self._lock:
        self.hits += 1


_hits: _CacheHits | None = None


def cache_hits() -> int:
  global _hits
  if _hits is None:
    _hits = _CacheHits()
  return _hits.hits


def compile_logged(lowerable, *args, name: str, detail: str = ""):
  """`lowerable.lower(*args).compile()`, logging the time and whether the cache held it.

  Returns (compiled executable, seconds).
  """
  hits = cache_hits()
  start = time.perf_counter()
  compiled = lowerable.lower(*args).compile()
  seconds = time.perf_counter() - start
  source = "loaded from the compilation cache" if cache_hits() > hits else "compiled"
  logging.info("%s%s %s in %.1f s", name, f" {detail}" if detail else "", source, seconds)
  return compiled, seconds


def threefry_kernel():
  """A context (this thread only) in which threefry lowers to jax's GPU kernel: the same
  bits as XLA's own lowering, compiled in a fraction of the time. No effect on CPUs and
  TPUs. jax keeps the flag in its compile key, and offers no public per-thread switch."""
  state = getattr(jax._src.config, "threefry_gpu_kernel_lowering", None)  # noqa: SLF001
  return state(True) if state is not None else contextlib.nullcontext()


def shape_key(tree) -> tuple:
  """Shapes and dtypes of a pytree's arrays: what a jitted function compiles for."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return (treedef, tuple((tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x))))
                         for x in leaves))


_executor: concurrent.futures.ThreadPoolExecutor | None = None


def background_executor() -> concurrent.futures.ThreadPoolExecutor:
  """Threads for compiles started ahead of their first use (XLA compiles outside the GIL)."""
  global _executor
  if _executor is None:
    _executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, min(8, (os.cpu_count() or 2) // 2)),
        thread_name_prefix="compile_ahead")
  return _executor


def cancel_queued() -> None:
  """Drops the compiles started ahead that have not begun (a run that failed in setup
  exits once the running one ends, not after every program it queued)."""
  global _executor
  if _executor is not None:
    _executor.shutdown(wait=False, cancel_futures=True)
    _executor = None


class PerShape:
  """A jitted function compiled once per input shape, each compile logged.

  `key(*args)` picks the arguments whose shapes tell programs apart (default: all),
  and `describe(*args)` names a shape in the log. `max_shapes` caps the number
  of programs: one more is an error naming the cap (the batching that feeds
  this function should never produce it). `context()` is entered around every
  compile (a mesh, axis rules: they are per thread, and compiles may run on
  another thread, `compile_ahead`).
  """

  def __init__(self, jitted, name: str, *, max_shapes: int | None = None,
               key: Callable[..., Any] | None = None,
               describe: Callable[..., str] | None = None,
               context: Callable[[], Any] = contextlib.nullcontext):
    self.jitted, self.name, self.max_shapes, self._context = jitted, name, max_shapes, context
    self._key = key or (lambda *args: args)
    self._describe = describe or (lambda *args: "")
    self._compiled: dict[tuple, Any] = {}
    self._pending: dict[tuple, concurrent.futures.Future] = {}
    self._lock = threading.Lock()
    self.compile_seconds: dict[str, float] = {}

  def _compile(self, args) -> Any:
    detail = self._describe(*args)
    with self._context():
      compiled, seconds = compile_logged(self.jitted, *args, name=self.name,
                                         detail=f"for {detail}" if detail else "")
    self.compile_seconds[detail or str(len(self.compile_seconds) + 1)] = seconds
    return compiled

  def _reserve(self, key, args) -> bool:
    """True if `key` is new (and now counted); an error beyond `max_shapes`."""
    if key in self._compiled or key in self._pending:
      return False
    if self.max_shapes is not None and len(self._compiled) + len(self._pending) >= self.max_shapes:
      raise RuntimeError(f"{self.name}: a shape beyond the cap of {self.max_shapes} "
                         f"({self._describe(*args)}); compiled so far: "
                         f"{list(self.compile_seconds)}")
    return True

  def compile_ahead(self, *args) -> None:
    """Starts compiling for these arguments' shapes on a background thread.

    `args` may be arrays or `jax.ShapeDtypeStruct`s (with the shardings the real
    arguments will have). A later call with these shapes waits for that compile
    instead of starting its own, so several shapes compile at once, and while
    the caller does other work (the first train steps).
    """
    key = shape_key(self._key(*args))
    with self._lock:
      if self._reserve(key, args):
        self._pending[key] = background_executor().submit(self._compile, args)

  def cancel_pending(self) -> None:
    """Drops this function's compiles queued ahead that have not begun (a translator
    whose checkpoints failed to load); others' queued compiles go on."""
    with self._lock:
      for key, future in list(self._pending.items()):
        if future.cancel():
          del self._pending[key]

  def __call__(self, *args):
    return self.executable(*args)(*args)

  def executable(self, *args):
    """The program for these arguments' shapes: compiled now, or the one compiling ahead."""
    key = shape_key(self._key(*args))
    with self._lock:
      compiled = self._compiled.get(key)
      future = self._pending.get(key)
      if compiled is None and future is None:
        self._reserve(key, args)
    if compiled is None:
      try:
        compiled = future.result() if future is not None else self._compile(args)
      except concurrent.futures.CancelledError:  # Queued ahead, then cancel_queued(): now.
        compiled = self._compile(args)
      with self._lock:
        self._compiled[key] = compiled
        self._pending.pop(key, None)
    return compiled

  @property
  def num_shapes(self) -> int:
    return len(self._compiled)
