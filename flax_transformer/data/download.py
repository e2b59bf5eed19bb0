"""Files fetched over HTTP(S), whole or not at all: the one downloader of the data sources.

Multi30k's raw files (`data.sources`) and WMT's statmt.org archives (`data.wmt`) come
through `download`; `partial_path` also names WMT's unpacking folders. Names are each
call's own, so processes of one run fetching into one folder never clobber each other.
"""

from __future__ import annotations

import http.client
import logging
import os
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Callable

from flax_transformer.errors import DataError


def partial_path(target: Path) -> Path:
  """A name beside `target` that is this call's own (process id and a random part),
  to write `target` whole and rename it: processes or threads fetching or unpacking
  the same file never write into, or remove, each other's."""
  return target.with_name(f"{target.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def download(url: str, target: Path, *, hint: str, timeout_s: float = 120,
             expected_size: int | None = None,
             check: Callable[[Path], None] | None = None) -> None:
  """Fetches `url` into `target` whole, or raises DataError naming the URL and `hint`.

  Written through `partial_path`, renamed once complete: all the bytes the response's
  Content-Length announced (a connection closed early may simply end the stream) and
  `check(partial)` passed. `expected_size` (bytes) only paces the progress log.
  """
  partial = partial_path(target)
  start = last_log = time.time()
  done = 0
  try:
    with urllib.request.urlopen(url, timeout=timeout_s) as response, open(partial, "wb") as out:
      announced = response.headers.get("Content-Length")
      for block in iter(lambda: response.read(1 << 22), b""):
        out.write(block)
        done += len(block)
        if expected_size and time.time() - last_log > 30:
          last_log = time.time()
          rate = done / max(1e-9, last_log - start)
          logging.info("  %s: %.0f%%, %.1f MB/s, ETA %.0f s", target.name,
                       100 * done / expected_size, rate / 1e6, (expected_size - done) / rate)
    if announced is not None and done != int(announced):
      raise DataError(f"cannot download {url} (the connection ended after {done} of "
                      f"{int(announced)} bytes); {hint}")
    if check:
      check(partial)
  except BaseException as e:
    partial.unlink(missing_ok=True)
    # http.client.IncompleteRead (a chunked response cut short) is no OSError.
    if isinstance(e, (OSError, http.client.HTTPException)):
      raise DataError(f"cannot download {url} ({type(e).__name__}: {e}); {hint}") from None
    raise
  os.replace(partial, target)
