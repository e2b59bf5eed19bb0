"""The host this process runs on."""

import os


def usable_cores() -> int:
  """Cores this process may use (its affinity on Linux; all cores elsewhere)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1
