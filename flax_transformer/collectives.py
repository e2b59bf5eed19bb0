"""What the processes of a multi-process run (jax.distributed, one per host) agree on
with one host-level collective each. With one process each returns its input."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def broadcast_from_process0(flag: bool) -> bool:
  """Process 0's `flag`, on every process (a decision all must take alike)."""
  if jax.process_count() == 1:
    return flag
  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


def each_process_text(text: str, max_bytes: int = 1024) -> list[str]:
  """Every process's `text` (its first `max_bytes` of UTF-8), indexed by process, on
  every process: one collective."""
  if jax.process_count() == 1:
    return [text]
  mine = np.zeros(max_bytes, np.uint8)  # A fixed shape: every process's must match.
  encoded = text.encode()[:max_bytes]
  mine[:len(encoded)] = np.frombuffer(encoded, np.uint8)
  return [bytes(row).rstrip(b"\0").decode(errors="ignore")
          for row in multihost_utils.process_allgather(mine)]
