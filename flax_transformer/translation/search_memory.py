"""Will a search fit? An estimate of the memory one batch's search holds, against the
device's, so an impossible beam or batch is refused in one line before it compiles
(XLA would otherwise ask for the memory, petabytes for a beam of 10^6, and fail in a
traceback, or the host would swap and the kernel end the process).

The estimate is a lower bound: the arrays every step of the search keeps at once
(each member's decoder key/value cache for rows x beams x output length, its
encoder-decoder keys/values, a step's scores over the vocabulary, the search's
history), not XLA's temporaries. Refused is what cannot fit, never what might.
"""

from __future__ import annotations

import os
from typing import Sequence

import jax
import numpy as np

from flax_transformer.errors import ConfigError
from flax_transformer.network.config import TransformerConfig

FLOAT32 = 4  # Bytes: a step's scores (log-softmax, candidates) and the history's ids.


def decode_length(extra: int, max_len: int, width: int, prefix_width: int | None = None
                  ) -> int:
  """Positions a search of sources `width` tokens wide decodes: up to `extra` (max_extra)
  more, capped by the model's `max_len`; with forced prefixes `prefix_width` wide, room
  for the longest and at least its EOS."""
  if prefix_width is None:
    return min(width + extra, max_len)
  return min(max(width, prefix_width) + max(extra, 1), max_len)


def search_bytes(configs: Sequence[TransformerConfig], *, rows: int, beams: int, width: int,
                 length: int) -> int:
  """Bytes one search of `rows` sentences `width` tokens wide holds at least, with `beams`
  hypotheses per sentence (1 when sampling) and outputs of up to `length` tokens."""
  hypotheses = rows * beams
  total = 2 * hypotheses * configs[0].vocab_size * FLOAT32  # log-probs and candidates.
  total += length * hypotheses * FLOAT32  # The search's history of choices.
  scores = 0
  for config in configs:
    itemsize = np.dtype(config.dtype).itemsize
    layers = config.num_decoder_layers or config.num_layers
    d_k = config.d_k or config.d_model // config.num_heads
    d_v = config.d_v or config.d_model // config.num_heads
    per_position = config.num_heads * (d_k + d_v) * itemsize * layers
    cross_rows = rows if config.share_beam_cache else hypotheses
    total += per_position * (hypotheses * length + cross_rows * width)
    # One layer's self-attention scores: with share_beam_cache each beam's query reads
    # every beam's slots (beams x beams x length per sentence and head).
    slots = beams * length if config.share_beam_cache else length
    scores = max(scores, hypotheses * config.num_heads * slots * FLOAT32)
  return total + scores


def available_bytes(device: jax.Device | None = None) -> tuple[int, str]:
  """(bytes a new program may still take on `device` (default: the first), where that
  figure comes from). An accelerator's memory_stats (limit less in use); a CPU device's
  share of the host's available memory (its devices run their searches at once)."""
  device = device or jax.devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and "bytes_limit" in stats:
    return (stats["bytes_limit"] - stats.get("bytes_in_use", 0),
            f"free on {device.platform}:{device.id}")
  devices = len(jax.local_devices(backend="cpu")) if device.platform == "cpu" else 1
  share = f" per device (its {devices} CPU devices search at once)" if devices > 1 else ""
  return _host_available() // devices, f"of the host's available memory{share}"


# One accelerator's memory at the most (B200 and MI300X: 192 GB): an exported search
# that needs more runs on no device of its platforms.
LARGEST_ACCELERATOR = 192 * 10**9


def export_bound(platforms: Sequence[str]) -> tuple[int, str]:
  """(bytes, what they are) an exported search (export.py) may need at most: it runs on
  a machine of `platforms`, not this host, so not this host's free memory, but what one
  device of them may hold: an accelerator's largest, or for 'cpu' alone this host's
  whole memory (a runner's host is taken to be of its kind)."""
  if any(platform != "cpu" for platform in platforms):
    return LARGEST_ACCELERATOR, f"one {'/'.join(platforms)} device may have at the most"
  total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  return total, "of this host's whole memory (an export's runner's host is taken as its like)"


def _host_available() -> int:
  """The host's available memory (Linux: MemAvailable; else free pages)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_search(configs: Sequence[TransformerConfig], search, *, rows: int, width: int,
                 prefix_width: int | None = None, device: jax.Device | None = None,
                 memory: tuple[int, str] | None = None) -> None:
  """A ConfigError, one line, if `search` (a SearchConfig) of [rows, width] on one device
  (forced prefixes `prefix_width` wide, if any) cannot fit in the memory it has, or in
  `memory` ((bytes, what they are)) where given (an export's `export_bound`)."""
  sampling = search.temperature > 0 or search.beam_size == 1
  max_len = min(c.max_len for c in configs)
  length = decode_length(min(search.max_extra, max_len), max_len, width, prefix_width)
  need = search_bytes(configs, rows=rows, beams=1 if sampling else search.beam_size,
                      width=width, length=length)
  have, where = memory or available_bytes(device)
  if need > have:
    raise ConfigError(
        f"beam_size={search.beam_size}: a search of {rows} sentence(s) x {width} tokens "
        f"(outputs up to {length}) needs at least {_size(need)}, over the {_size(have)} "
        f"{where}: use a smaller beam_size, max_extra or batch (decode.py's "
        "--batch_tokens, serve.py's --max_batch, the Translator's batch_tokens)")


def _size(count: int) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
    if count < 1024 or unit == "EiB":
      return f"{count:.4g} {unit}" if unit == "B" else f"{count:.1f} {unit}"
    count /= 1024
  raise AssertionError("unreachable")
