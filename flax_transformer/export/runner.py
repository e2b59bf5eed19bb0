"""Translate with an exported model, without flax_transformer, flax or orbax.

  python translate.py [--model DIR] [--input FILE|-] [--output FILE|-] [--target_lang CODE]

DIR (default: this file's folder) holds what export.py wrote: StableHLO (needs
jax, numpy, sentencepiece) or CTranslate2 (needs ctranslate2, sentencepiece).
One output line per input line; an empty line translates to an empty one. As a
library: `open_model(DIR).translate(["A dog runs."])`. An imported OPUS-MT model that
chooses its target by a tag before the source ('>>fra<< A dog runs.'): --target_lang=fra
(translate(lines, target_lang="fra")) puts the tag before each line, as decode.py's
--target_lang does; the manifest's languages record names the codes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

FORMAT = "flax_transformer.stablehlo/1"
CT2_FORMAT = "flax_transformer.ctranslate2/1"


def _cores() -> int:
  """The cores this process may run on (all of them where the OS cannot say)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _use_cpu_cores(count: int) -> None:
  """One XLA CPU device per core (before jax starts): one search per core, as decode.py."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    count = count or _cores()
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


class _SentencePieceVocabulary:
  """A model trained here: one sentencepiece vocabulary (vocab.model) for both sides."""

  def __init__(self, folder: Path):
    import sentencepiece as spm

    self.sp = spm.SentencePieceProcessor(model_file=str(folder / "vocab.model"))
    self.source_piece = self.target_piece = self.sp.id_to_piece
    self.target_id = self.sp.piece_to_id
    self.encode, self.decode = self.sp.encode, self.sp.decode


class _MarianVocabulary:
  """An imported Marian (OPUS-MT) model's tokenizer, as transformers' MarianTokenizer:
  the text cut at special tokens' strings, sentencepiece pieces looked up in vocab.json
  (target_vocab.json for the targets where separate; ids already the project's), a
  '>>tag<<' starting a piece of text one token; outputs without pad, EOS and unknown
  tokens, cleaned up as transformers does where the spec says. (flax_transformer.pretrained.tokenizers', restated: this
  file travels without the package.)"""

  def __init__(self, folder: Path, spec: dict):
    import sentencepiece as spm

    if spec.get("kind") != "marian":
      raise SystemExit(f"error: {folder}: tokenizer kind {spec.get('kind')!r} is not one "
                       "this runner reads")
    separate = spec.get("separate_vocabularies")
    self.sp = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
    self.vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    target = json.loads((folder / ("target_vocab.json" if separate else "vocab.json"))
                        .read_text(encoding="utf-8"))
    self.target_id = target.__getitem__
    self._source_pieces = {i: piece for piece, i in self.vocab.items()}
    self._target_pieces = {i: piece for piece, i in target.items()}
    # transformers joins a shared vocabulary's output pieces with source.spm.
    self._joiner = spm.SentencePieceProcessor(model_file=str(
        folder / ("target.spm" if separate else "source.spm")))
    self._dropped = {target["<pad>"], target["</s>"], target["<unk>"]}
    # transformers' clean_up_tokenization, where tokenizer_config.json asked for it.
    self._clean_up = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                      (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                      (" 're", "'re")) if spec.get("clean_up_tokenization_spaces") else ()

  def source_piece(self, i: int) -> str:
    return self._source_pieces[i]

  def target_piece(self, i: int) -> str:
    return self._target_pieces[i]

  def encode(self, line: str) -> list[int]:
    pieces = []
    for chunk in re.split("(</s>|<unk>|<pad>)", line):  # Special tokens' text: one token.
      if chunk in ("</s>", "<unk>", "<pad>"):
        pieces.append(chunk)
      elif chunk:
        if chunk.startswith(">>") and (end := chunk.find("<<")) != -1:
          pieces.append(chunk[:end + 2])
          chunk = chunk[end + 2:]
        pieces += self.sp.encode(chunk, out_type=str)
    unknown = self.vocab["<unk>"]
    return [self.vocab.get(p, unknown) for p in pieces]

  def decode(self, ids: list[int]) -> str:
    pieces = [self._target_pieces[i] for i in ids if i not in self._dropped]
    text = self._joiner.decode_pieces(pieces).replace("\u2581", " ").strip()
    for before, after in self._clean_up:
      text = text.replace(before, after)
    return text


class _Model:
  """What both formats share: the manifest, the vocabulary, text <-> ids."""

  def __init__(self, folder: Path, formats: tuple[str, ...]):
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
      raise SystemExit(f"error: {manifest_path} not found: --model must be a folder written "
                       "by export.py")
    self.manifest = json.loads(manifest_path.read_text())
    if self.manifest.get("format") not in formats:
      raise SystemExit(f"error: {manifest_path}: format {self.manifest.get('format')!r}, "
                       f"expected one of {formats}")
    tokenizer = self.manifest.get("tokenizer")  # An imported model's; else vocab.model.
    self.vocab = (_MarianVocabulary(folder, tokenizer) if tokenizer
                  else _SentencePieceVocabulary(folder))
    self.eos_id, self.pad_id = self.manifest["eos_id"], self.manifest["pad_id"]
    self.max_len = self.manifest["max_len"]
    self.languages = self.manifest.get("languages") or {}
    self.truncated = 0

  def tagged(self, lines: list[str], target_lang: str | None) -> list[str]:
    """`lines` with the target's tag before each non-empty one (an OPUS-MT model's
    '>>fra<<', as decode.py --target_lang puts it); as they are where target_lang is None."""
    if target_lang is None:
      return lines
    languages = self.languages
    if languages.get("target_by") != "source_tag":
      raise SystemExit(f"error: --target_lang={target_lang}: this model takes no target tag "
                       "(its manifest.json has no source_tag languages record); its target "
                       "is the one it was trained into")
    tag = languages["target_tokens"].get(target_lang)
    if tag is None:
      raise SystemExit(f"error: --target_lang={target_lang}: the model translates into "
                       f"{', '.join(languages['targets'])}")
    return [f"{tag} {line}" if line.strip() else line for line in lines]

  def ids(self, line: str) -> list[int]:
    """Source ids, EOS-terminated, cut at max_len (as decode.py)."""
    ids = self.vocab.encode(line) + [self.eos_id]
    if len(ids) > self.max_len:
      self.truncated += 1
      ids = ids[:self.max_len]
    return ids

  def text(self, ids) -> str:
    """Output ids up to the first EOS, padding skipped -> one line of text."""
    out = []
    for i in ids:
      if i == self.eos_id:
        break
      if i != self.pad_id:
        out.append(int(i))
    text = self.vocab.decode(out)
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text

  def sorted_sources(self, lines: list[str]) -> list[tuple[int, list[int]]]:
    """(line index, ids) of the non-empty lines, shortest first (stable, as decode.py)."""
    todo = [(i, self.ids(line)) for i, line in enumerate(lines) if line.strip()]
    return sorted(todo, key=lambda item: len(item[1]))


# jax.default_backend() names a GPU 'gpu'; jax.export names its platforms 'cuda' or 'rocm'.
_BACKEND_PLATFORMS = {"gpu": ("cuda", "rocm")}


def exported_devices(jax, platforms: list[str]) -> list:
  """This host's devices of a platform the model was exported for: the default
  backend's where it was exported for it, else the first of `platforms` jax has here
  (a CPU export on a CUDA host runs on the CPU)."""
  default = jax.default_backend()
  ours = _BACKEND_PLATFORMS.get(default, (default,))
  for platform in sorted(platforms, key=lambda p: p not in ours):  # Stable: export order.
    try:
      return jax.local_devices(backend=platform)
    except RuntimeError:  # "Unknown backend": this jax lacks it.
      continue
  raise SystemExit(f"error: the model was exported for {', '.join(platforms)}, which this "
                   f"jax cannot run (its default backend: {default}); export it again with "
                   f"--platforms={ours[0]}")


class Runner(_Model):
  """An exported StableHLO model: `translate(lines) -> lines` (beam search as exported)."""

  def __init__(self, model_dir: str | Path):
    import jax
    import numpy as np

    start = time.perf_counter()
    super().__init__(Path(model_dir), (FORMAT,))
    self._jax, self._np = jax, np
    folder = Path(model_dir)
    # Older exports name no dtypes: their float32 leaves load as saved.
    dtypes = self.manifest.get("param_dtypes") or [None] * self.manifest["num_params"]
    with np.load(folder / "params.npz") as data:
      # bfloat16 (numpy's format cannot name it) was stored as uint16: same bits, viewed back.
      leaves = [data[f"leaf_{i}"] if d is None else data[f"leaf_{i}"].view(jax.numpy.dtype(d))
                for i, d in enumerate(dtypes)]
    self.devices = exported_devices(jax, self.manifest["platforms"])
    self._params = [jax.device_put(leaves, d) for d in self.devices]
    self._searches = {entry["width"]: (entry["rows"], jax.export.deserialize(
        bytearray((folder / entry["file"]).read_bytes()))) for entry in self.manifest["shapes"]}
    self.widths = sorted(self._searches)
    self.load_seconds = time.perf_counter() - start

  def translate(self, lines: list[str], target_lang: str | None = None) -> list[str]:
    """One translation per line, in order; each batch shaped as one of decode.py's."""
    np = self._np
    lines = self.tagged(lines, target_lang)
    results = [""] * len(lines)
    chunks: list[tuple[int, list[tuple[int, list[int]]]]] = []
    for i, ids in self.sorted_sources(lines):
      width = next(w for w in self.widths if w >= len(ids))
      if not chunks or chunks[-1][0] != width or len(chunks[-1][1]) == self._searches[width][0]:
        chunks.append((width, []))
      chunks[-1][1].append((i, ids))
    pending = []
    for n, (width, members) in enumerate(chunks):
      rows, exported = self._searches[width]
      batch = np.zeros((rows, width), np.int32)
      for row, (_, ids) in enumerate(members):
        batch[row, :len(ids)] = ids
      device = n % len(self.devices)  # Dispatch is asynchronous: one search per device at once.
      pending.append((members, exported.call(self._params[device],
                                             self._jax.device_put(batch, self.devices[device]))))
    for members, (sequences, _) in pending:
      sequences = np.asarray(sequences)
      for row, (i, _) in enumerate(members):
        results[i] = self.text(sequences[row].tolist())
    return results


class Ct2Runner(_Model):
  """A CTranslate2 model written by export.py: `translate(lines) -> lines`.

  Sentences are grouped by their longest allowed output (source length +
  max_extra tokens, EOS included, capped by max_len, as our search), since
  CTranslate2 takes one max_decoding_length per call; it then stops where our
  search forces EOS. Its beam search runs without a length penalty and its n-best
  hypotheses are ranked by ours (GNMT's), which CTranslate2 does not offer.
  """

  def __init__(self, model_dir: str | Path, *, compute_type: str = "default", threads: int = 1,
               workers: int = 0, max_batch_size: int = 64):
    start = time.perf_counter()
    super().__init__(Path(model_dir), (CT2_FORMAT,))
    import ctranslate2

    # `workers` translators (CTranslate2's inter_threads; 0 = one per core) of `threads`
    # threads each take the batches in turn. At d_model 256 a batch per core, one
    # thread each, beat threads sharing each batch, int8 most (BENCHMARKS.md, Export).
    self.model = ctranslate2.Translator(
        str(model_dir), device="cpu", compute_type=compute_type,
        inter_threads=workers or _cores(), intra_threads=threads)
    self.max_batch_size = max_batch_size
    self.load_seconds = time.perf_counter() - start

  def translate(self, lines: list[str], target_lang: str | None = None, *,
                beam_size: int | None = None, alpha: float | None = None,
                max_extra: int | None = None) -> list[str]:
    """Beam search (default: the manifest's settings; beam_size=1 is greedy)."""
    lines = self.tagged(lines, target_lang)
    search = self.manifest["search"]
    beam_size = search["beam_size"] if beam_size is None else beam_size
    alpha = search["alpha"] if alpha is None else alpha
    max_extra = search["max_extra"] if max_extra is None else max_extra
    results = [""] * len(lines)
    groups: dict[int, list[tuple[int, list[int]]]] = {}
    for i, ids in self.sorted_sources(lines):
      groups.setdefault(min(len(ids) + max_extra, self.max_len), []).append((i, ids))
    pad = [self.vocab.target_piece(self.pad_id)]
    pending = []  # Every group submitted before any is awaited: the workers share them.
    for longest, members in sorted(groups.items()):
      # Unpenalised scores, so its beam can stop early; its n-best is then ranked by
      # GNMT's penalty, ours (CTranslate2's own divides by length ** alpha).
      pending.append((members, self.model.translate_batch(
          [[self.vocab.source_piece(t) for t in ids] for _, ids in members],
          beam_size=beam_size,
          num_hypotheses=beam_size, length_penalty=0, return_scores=True,
          max_decoding_length=longest - 1,  # Tokens before a forced EOS.
          max_batch_size=self.max_batch_size, suppress_sequences=[pad], asynchronous=True)))
    for members, found in pending:
      for (i, _), future in zip(members, found):
        result = future.result()
        best = max(zip(result.hypotheses, result.scores),
                   key=lambda h: h[1] / ((5.0 + len(h[0]) + 1) / 6.0) ** alpha)  # EOS counts.
        results[i] = self.text([self.vocab.target_id(p) for p in best[0]])
    return results


def open_model(model_dir: str | Path, **ct2_options) -> Runner | Ct2Runner:
  """The runner for what `model_dir` holds (its manifest's format)."""
  path = Path(model_dir) / "manifest.json"
  fmt = json.loads(path.read_text()).get("format") if path.is_file() else None
  return Ct2Runner(model_dir, **ct2_options) if fmt == CT2_FORMAT else Runner(model_dir)


def _read_lines(path: str) -> tuple[list[str], list[str]]:
  """The lines and each one's ending: decode.py's reading (data.sources.split_lines_lenient,
  cli.translate.line_endings: "\r\n" where it was, a last line with none the one's before),
  restated: this file travels without the package."""
  raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
  parts = raw.split(b"\n")
  last = parts.pop()  # What follows the last newline: "", or a line with none.
  endings = ["\r\n" if p.endswith(b"\r") else "\n" for p in parts]
  if last:
    parts.append(last)
    endings.append("\r\n" if last.endswith(b"\r") else (endings or ["\n"])[-1])
  return [p[:-1].decode("utf-8", "replace") if p.endswith(b"\r") else
          p.decode("utf-8", "replace") for p in parts], endings


def main(argv: list[str] | None = None) -> None:
  """translate.py: a usage or data error (SystemExit with its one line) exits 2, as
  argparse's own and the project's scripts do."""
  try:
    _translate_files(argv)
  except SystemExit as e:
    if not isinstance(e.code, str):
      raise
    print(e.code, file=sys.stderr)
    raise SystemExit(2) from None


def _translate_files(argv: list[str] | None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default=str(Path(__file__).resolve().parent))
  parser.add_argument("--input", default="-")
  parser.add_argument("--output", default="-")
  parser.add_argument("--devices", type=int, default=0,
                      help="StableHLO: CPU devices, one search each (0 = one per core)")
  parser.add_argument("--workers", type=int, default=0,
                      help="CTranslate2: batches translated at once (0 = one per core)")
  parser.add_argument("--threads", type=int, default=1,
                      help="CTranslate2: threads per worker")
  parser.add_argument("--compute_type", default="default",
                      help="CTranslate2: int8, float32, ... (default: as converted)")
  parser.add_argument("--target_lang", default=None,
                      help="an OPUS-MT model's target: its tag ('>>fra<<') before each line")
  args = parser.parse_args(argv)
  _use_cpu_cores(args.devices)
  if args.input != "-" and not Path(args.input).is_file():
    raise SystemExit(f"error: --input {args.input} does not exist")
  output = Path(args.output)
  if args.output != "-" and (output.is_dir() or not output.parent.is_dir()):
    raise SystemExit(f"error: --output {args.output}: not a file in an existing folder")
  runner = open_model(args.model, compute_type=args.compute_type, threads=args.threads,
                      workers=args.workers)
  lines, endings = _read_lines(args.input)
  start = time.perf_counter()
  out = runner.translate(lines, args.target_lang)
  seconds = time.perf_counter() - start
  text = "".join(line + end for line, end in zip(out, endings))  # Each as its input's.
  if args.output == "-":
    sys.stdout.write(text)
  else:
    try:
      Path(args.output).write_text(text, encoding="utf-8", newline="")
    except OSError as e:  # A full disk, a read-only file system: past the check made first.
      raise SystemExit(f"error: --output {args.output}: {e.strerror or e}") from None
  if runner.truncated:
    print(f"warning: {runner.truncated} sentence(s) longer than max_len={runner.max_len} "
          "tokens were truncated", file=sys.stderr)
  print(f"translated {len(lines)} lines in {seconds:.1f} s (loaded in "
        f"{runner.load_seconds:.1f} s)", file=sys.stderr)


if __name__ == "__main__":
  main()
