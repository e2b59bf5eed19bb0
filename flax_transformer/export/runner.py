"""Translate with an exported model: jax, numpy and sentencepiece only.

  python translate.py [--model DIR] [--input FILE|-] [--output FILE|-] [--devices N]

DIR (default: this file's folder) holds what `flax_transformer.export.stablehlo`
wrote. One output line per input line; an empty line translates to an empty one.
This file imports nothing of flax_transformer, flax or orbax: copy the folder
anywhere jax runs. As a library: `Runner(DIR).translate(["A dog runs."])`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

FORMAT = "flax_transformer.stablehlo/1"


def _use_cpu_cores(count: int) -> None:
  """One XLA CPU device per core (before jax starts): one search per core, as decode.py."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    count = count or len(os.sched_getaffinity(0))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


class Runner:
  """An exported model: `translate(lines) -> lines`."""

  def __init__(self, model_dir: str | Path):
    import jax
    import numpy as np
    import sentencepiece as spm

    self._jax, self._np = jax, np
    start = time.perf_counter()
    folder = Path(model_dir)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
      raise SystemExit(f"error: {manifest_path} not found: --model must be a folder written "
                       "by export.py --format=stablehlo")
    self.manifest = json.loads(manifest_path.read_text())
    if self.manifest.get("format") != FORMAT:
      raise SystemExit(f"error: {manifest_path}: format {self.manifest.get('format')!r}, this "
                       f"runner reads {FORMAT!r}")
    self.sp = spm.SentencePieceProcessor(model_file=str(folder / "vocab.model"))
    with np.load(folder / "params.npz") as data:
      leaves = [data[f"leaf_{i}"] for i in range(self.manifest["num_params"])]
    self.devices = jax.local_devices()
    self._params = [jax.device_put(leaves, d) for d in self.devices]
    self._searches = {entry["width"]: (entry["rows"], jax.export.deserialize(
        bytearray((folder / entry["file"]).read_bytes()))) for entry in self.manifest["shapes"]}
    self.widths = sorted(self._searches)
    self.load_seconds = time.perf_counter() - start
    self.truncated = 0

  def _ids(self, line: str) -> list[int]:
    ids = self.sp.encode(line) + [self.manifest["eos_id"]]
    if len(ids) > self.manifest["max_len"]:
      self.truncated += 1
      ids = ids[:self.manifest["max_len"]]
    return ids

  def _text(self, ids) -> str:
    out = []
    for i in ids.tolist():
      if i == self.manifest["eos_id"]:
        break
      if i != self.manifest["pad_id"]:
        out.append(i)
    text = self.sp.decode(out)
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text

  def translate(self, lines: list[str]) -> list[str]:
    """One translation per line, in order (beam search with the manifest's settings)."""
    np = self._np
    results = [""] * len(lines)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    ids = {i: self._ids(lines[i]) for i in todo}
    todo.sort(key=lambda i: len(ids[i]))  # Stable: like decode.py, similar lengths together.
    chunks = []
    for i in todo:
      width = next(w for w in self.widths if w >= len(ids[i]))
      rows = self._searches[width][0]
      if not chunks or chunks[-1][0] != width or len(chunks[-1][1]) == rows:
        chunks.append((width, []))
      chunks[-1][1].append(i)
    pending = []
    for n, (width, members) in enumerate(chunks):
      rows, exported = self._searches[width]
      batch = np.zeros((rows, width), np.int32)
      for row, i in enumerate(members):
        batch[row, :len(ids[i])] = ids[i]
      device = n % len(self.devices)  # Dispatch is asynchronous: one search per device at once.
      pending.append((members, exported.call(self._params[device],
                                             self._jax.device_put(batch, self.devices[device]))))
    for members, (sequences, _) in pending:
      sequences = np.asarray(sequences)
      for row, i in enumerate(members):
        results[i] = self._text(sequences[row])
    return results


def _read_lines(path: str) -> list[str]:
  raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
  parts = raw.split(b"\n")
  if parts and parts[-1] == b"":
    parts.pop()
  return [p[:-1].decode("utf-8", "replace") if p.endswith(b"\r") else
          p.decode("utf-8", "replace") for p in parts]


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default=str(Path(__file__).resolve().parent))
  parser.add_argument("--input", default="-")
  parser.add_argument("--output", default="-")
  parser.add_argument("--devices", type=int, default=0,
                      help="CPU devices, one search each (0 = one per core)")
  args = parser.parse_args(argv)
  _use_cpu_cores(args.devices)
  if args.input != "-" and not Path(args.input).is_file():
    raise SystemExit(f"error: --input {args.input} does not exist")
  runner = Runner(args.model)
  lines = _read_lines(args.input)
  start = time.perf_counter()
  out = runner.translate(lines)
  seconds = time.perf_counter() - start
  text = "".join(line + "\n" for line in out)
  if args.output == "-":
    sys.stdout.write(text)
  else:
    Path(args.output).write_text(text, encoding="utf-8")
  if runner.truncated:
    print(f"warning: {runner.truncated} sentence(s) longer than max_len="
          f"{runner.manifest['max_len']} tokens were truncated", file=sys.stderr)
  print(f"translated {len(lines)} lines in {seconds:.1f} s on {len(runner.devices)} "
        f"device(s) (loaded in {runner.load_seconds:.1f} s)", file=sys.stderr)


if __name__ == "__main__":
  main()
