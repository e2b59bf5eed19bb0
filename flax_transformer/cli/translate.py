"""decode.py's work: read sentences, translate, write one line per input, score."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF, TER
from tqdm import tqdm

from flax_transformer import compilation
from flax_transformer import workdir as workdir_lib
from flax_transformer.data.sources import split_lines_lenient
from flax_transformer.errors import DataError
from flax_transformer.translation.translator import Translator

METRICS = ("bleu", "chrf", "ter")


def _read(path: str, what: str) -> list[str]:
  return _read_ended(path, what)[0]


def line_endings(raw: bytes) -> list[str]:
  """Each line's ending, as split_lines_lenient splits `raw`: CRLF where it was (a
  Windows file's), else LF; a last line with none, the line's before it. Each output
  line ends as its input line did."""
  parts = raw.split(b"\n")
  last = parts.pop()  # What follows the last newline: "", or a line with none.
  endings = ["\r\n" if part.endswith(b"\r") else "\n" for part in parts]
  if last:
    endings.append("\r\n" if last.endswith(b"\r") else (endings or ["\n"])[-1])
  return endings


def _read_ended(path: str, what: str) -> tuple[list[str], list[str]]:
  """A file's lines ("-": stdin's), and each one's ending (`line_endings`)."""
  if path == "-":
    raw = sys.stdin.buffer.read()
  else:
    # Not is_file(): a pipe (`--input=<(zcat test.en.gz)`) or /dev/null is input too.
    if not Path(path).exists():
      raise DataError(f"{what} file {path} does not exist")
    if Path(path).is_dir():
      raise DataError(f"{what} {path} is a directory, not a file")
    raw = Path(path).read_bytes()
  lines, invalid = split_lines_lenient(raw)
  if invalid:
    shown = ", ".join(map(str, invalid[:10])) + (" ..." if len(invalid) > 10 else "")
    logging.warning("%s %s: %d line(s) are not valid UTF-8 (bad bytes replaced): line %s",
                    what, path, len(invalid), shown)
  return lines, line_endings(raw)


def _read_aligned(path: str, flag: str, input_path: str, count: int) -> list[str]:
  """A file with one line per input line; a DataError naming both files otherwise."""
  lines = _read(path, flag)
  if len(lines) != count:
    shown = "stdin" if input_path == "-" else input_path
    raise DataError(f"{flag} {path} has {len(lines)} lines but --input {shown} has {count}")
  return lines


@contextlib.contextmanager
def _naming(flag: str, path: str | None):
  """The Translator's DataErrors about prefixes or targets say 'line N: ...'; name the file."""
  try:
    yield
  except DataError as e:
    if path is None:
      raise
    raise DataError(f"{flag} {path}: {e}") from None


@contextlib.contextmanager
def _output(path: str):
  # newline="": each line's own ending as written ("\r\n" stays one, on Windows too).
  out = sys.stdout if path == "-" else open(path, "w", encoding="utf-8", newline="")
  try:
    yield out
  finally:
    if out is not sys.stdout:
      out.close()


def one_line(text: str) -> str:
  # A translation must never add output lines.
  return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text


def output_lines(index: int, hyps: Sequence[tuple[str, float]], nbest: int, end: str = "\n"
                 ) -> list[str]:
  """decode.py's lines for input line `index`: its best translation, or with nbest > 1
  one 'index ||| translation ||| score' line per hypothesis; each ending with `end`."""
  if nbest == 1:
    return [one_line(hyps[0][0]) + end]
  return [f"{index} ||| {one_line(text)} ||| {value:.4f}{end}" for text, value in hyps]


def score(hypotheses: Sequence[str], references: Sequence[str], metrics: Sequence[str],
          tokenize: str | None = None) -> list[tuple[str, float, str]]:
  """(name, score, sacrebleu signature) per metric, detokenized text in. BLEU comes
  twice: cased, then lowercased ('bleu lowercased'), as Multi30k papers report it."""
  bleu = {"tokenize": tokenize} if tokenize else {}
  makers = {"bleu": [("bleu", lambda: BLEU(**bleu)),
                     ("bleu lowercased", lambda: BLEU(lowercase=True, **bleu))],
            "chrf": [("chrf", CHRF)], "ter": [("ter", TER)]}
  out = []
  for label, make in (entry for name in metrics for entry in makers[name]):
    metric = make()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    out.append((label, result.score, str(metric.get_signature())))
  return out


def run_decode(*, workdir: str, input_path: str, output_path: str, reference: str | None,
               metrics: Sequence[str], sacrebleu_tokenize: str | None,
               attention_plot: str | None, attention_sentences: int = 1,
               compilation_cache_dir: str = "", prefix_path: str | None = None,
               score_path: str | None = None, split_sentences: bool = False,
               source_lang: str | None = None, target_lang: str | None = None,
               **from_workdir) -> None:
  """decode.py's work; `from_workdir` goes to `Translator.from_workdir` (search included)."""
  direction = direction_of(workdir, source_lang, target_lang)
  unknown = [m for m in metrics if m not in METRICS]
  if unknown:
    raise DataError(f"--metrics: unknown {unknown}; choose from {', '.join(METRICS)}")
  if score_path:
    given = [f for f, v in (("--prefix", prefix_path), ("--reference", reference),
                            ("--attention_plot", attention_plot)) if v]
    if given:
      raise DataError(f"--score scores the given targets and translates nothing: drop "
                      f"{', '.join(given)}")
  sentences, endings = _read_ended(input_path, "input")
  if split_sentences:
    return run_split(workdir, sentences, output_path, prefix_path, score_path, attention_plot,
                     reference, compilation_cache_dir=compilation_cache_dir,
                     direction=direction, endings=endings, **from_workdir)
  if score_path:
    targets = _read_aligned(score_path, "--score", input_path, len(sentences))
    run_score(Translator.from_workdir(workdir, **from_workdir), sentences, targets,
              score_path, output_path, compilation_cache_dir, direction, endings)
    return
  prefixes = (_read_aligned(prefix_path, "--prefix", input_path, len(sentences))
              if prefix_path else None)
  references = _read(reference, "reference") if reference else None
  if references is not None and len(references) != len(sentences):
    raise DataError(f"--reference {reference} has {len(references)} lines but the input has "
                    f"{len(sentences)}")
  # The searches compile while the checkpoints load and average.
  translator = Translator.from_workdir(workdir, compile_for=sentences, compile_prefixes=prefixes,
                                       compilation_cache_dir=compilation_cache_dir, **from_workdir)
  nbest = translator.search.nbest
  logging.info("Decoding on %d %s device(s), one search each", len(translator.devices),
               translator.devices[0].platform)
  searched = [s.strip() or (prefixes is not None and prefixes[i].strip())
              for i, s in enumerate(sentences)]
  with tqdm(total=sum(map(bool, searched)), desc="translated", unit=" sentences",
            file=sys.stderr, mininterval=5.0, dynamic_ncols=True) as progress, \
      _naming("--prefix", prefix_path):
    results = translator.translate_nbest(sentences, progress, prefixes, **direction)
  with _output(output_path) as out:
    for i, hyps in enumerate(results):
      out.writelines(output_lines(i, hyps, nbest, endings[i]))
  if references is not None:
    best = [hyps[0][0] for hyps in results]
    for name, value, signature in score(best, references, metrics, sacrebleu_tokenize):
      print(f"{name.upper().replace('LOWERCASED', 'lowercased')} = {value:.2f}  ({signature})",
            file=sys.stderr)
  if attention_plot:
    from flax_transformer.translation.attention_plot import plot_attention  # matplotlib.

    for line, path in attention_plot_paths(sentences, attention_plot, attention_sentences):
      plot_attention(translator, sentences[line], results[line][0][0], path)
      print(f"attention plot of input line {line + 1} written to {path}", file=sys.stderr)


def direction_of(workdir: str, source_lang: str | None, target_lang: str | None) -> dict:
  """Translator's source_lang and target_lang, checked against the workdir's languages
  before anything loads (a pair it does not translate: one line naming those it does)."""
  source, target = workdir_lib.languages(workdir).check_pair(source_lang, target_lang)
  return dict(source_lang=source, target_lang=target)


def run_split(workdir: str, texts: Sequence[str], output_path: str, *others,
              compilation_cache_dir: str = "", direction: dict | None = None,
              endings: Sequence[str] | None = None, **from_workdir) -> None:
  """decode.py --split_sentences: each line a text of sentences (the workdir's source
  language's rules; English's where it records none), one translated line per line."""
  given = [f for f, v in zip(("--prefix", "--score", "--attention_plot", "--reference"), others)
           if v]
  if given or from_workdir["search"].nbest > 1:
    raise DataError(f"--split_sentences translates whole texts: drop "
                    f"{', '.join(given or ['--nbest'])}")
  direction = direction or {}
  language = direction.get("source_lang") or "en"
  translator = Translator.from_workdir(workdir, compilation_cache_dir=compilation_cache_dir,
                                       **from_workdir)
  logging.info("Splitting each line into %s sentences", language)
  with tqdm(desc="translated", unit=" sentences", file=sys.stderr, mininterval=5.0,
            dynamic_ncols=True) as progress:
    translations = translator.translate_texts(texts, language, progress,
                                              target_lang=direction.get("target_lang"))
  with _output(output_path) as out:
    out.writelines(one_line(text) + end
                   for text, end in zip(translations, endings or ["\n"] * len(texts)))


def run_score(translator: Translator, sentences: Sequence[str], targets: Sequence[str],
              targets_path: str, output_path: str, compilation_cache_dir: str,
              direction: dict | None = None, endings: Sequence[str] | None = None) -> None:
  """decode.py --score: per pair one line 'logprob<TAB>tokens' (natural log, EOS counted)."""
  compilation.enable_cache(compilation_cache_dir)
  logging.info("Scoring on %d %s device(s)", len(translator.devices),
               translator.devices[0].platform)
  with tqdm(total=len(sentences), desc="scored", unit=" pairs", file=sys.stderr,
            mininterval=5.0, dynamic_ncols=True) as progress, _naming("--score", targets_path):
    results = translator.score(sentences, targets, progress, **(direction or {}))
  with _output(output_path) as out:
    for (log_prob, tokens), end in zip(results, endings or ["\n"] * len(results)):
      out.write(f"{log_prob:.4f}\t{tokens}{end}")


def attention_plot_paths(sentences: Sequence[str], path: str, count: int
                         ) -> list[tuple[int, str]]:
  """(input line index, PNG path) for the first `count` non-empty sentences.

  One sentence keeps `path` as given; several get `<stem>_<line number><suffix>`.
  """
  lines = [i for i, s in enumerate(sentences) if s.strip()][:count]
  if count == 1:
    return [(i, path) for i in lines]
  target = Path(path)
  return [(i, str(target.with_name(f"{target.stem}_{i + 1}{target.suffix}"))) for i in lines]
