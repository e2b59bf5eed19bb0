"""glibc malloc settings under which XLA's CPU runtime reuses its per-step buffers.

XLA's CPU runtime mallocs a step's temporaries on every execution, hundreds of
MB for the base step. glibc hands blocks that large out as fresh mmap'ed pages
and unmaps them on free (a thread's arena always does, whatever the mmap
threshold), so each step the kernel faults in and zeroes every page again. With
one arena, no mmap and no trimming, the block comes back from the heap and the
faults go away (the measured gain: BENCHMARKS.md "Host memory"); the process
keeps its freed memory, so peak RSS is higher.

glibc reads these settings only at process start, so the entry points re-execute
themselves once with them in GLIBC_TUNABLES, first thing (before JAX loads, which costs
a second of CPU that the re-execution would throw away). A GLIBC_TUNABLES the user has set is
left alone; FLAX_TRANSFORMER_SYSTEM_MALLOC=1 keeps the system default. Hosts
where JAX runs on a GPU or TPU keep it too: the gain was measured on CPU steps.
"""

from __future__ import annotations

import os
from importlib import metadata
import platform
import sys

TUNABLES = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
            "glibc.malloc.trim_threshold=68719476736")
OPT_OUT = "FLAX_TRANSFORMER_SYSTEM_MALLOC"


# jax's accelerator plugins: with one installed, XLA's step buffers live on the device,
# and the settings were measured to help only where they live in host memory.
ACCELERATOR_PLUGINS = ("jax-cuda12-plugin", "jax-cuda13-plugin", "libtpu", "jax-rocm60-plugin",
                       "jax-rocm7-plugin")


def accelerator_host() -> bool:
  """True where JAX will run on an accelerator (JAX_PLATFORMS, else an installed plugin)."""
  platforms = os.environ.get("JAX_PLATFORMS", "").strip()
  if platforms:
    return platforms.split(",")[0].strip() not in ("cpu", "")
  for name in ACCELERATOR_PLUGINS:
    try:
      metadata.distribution(name)
    except metadata.PackageNotFoundError:
      continue
    return True
  return False


def wanted() -> bool:
  """True if this process should run with TUNABLES and does not yet (CPU hosts only)."""
  if os.environ.get(OPT_OUT, "") not in ("", "0") or "GLIBC_TUNABLES" in os.environ:
    return False
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  return not accelerator_host()


def reexec_with_reusable_malloc() -> None:
  """Replaces this process by the same command line with TUNABLES set, once.

  Returns only when nothing is to be done (see `wanted`). Call it before any
  work: the process starts over (same pid, same open files, stdin included).
  """
  if not wanted():
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
            dict(os.environ, GLIBC_TUNABLES=TUNABLES))


def describe() -> str:
  """One line for logs: which malloc settings this process runs with."""
  tunables = os.environ.get("GLIBC_TUNABLES")
  return f"GLIBC_TUNABLES={tunables}" if tunables else "system default malloc"
