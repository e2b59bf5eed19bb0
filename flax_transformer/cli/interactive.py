"""decode.py --interactive: each input line translated as it arrives, and flushed."""

from __future__ import annotations

import logging
import sys
from typing import BinaryIO, TextIO

from flax_transformer import compilation
from flax_transformer.cli.translate import direction_of, line_endings, one_line, output_lines
from flax_transformer.data.sources import split_lines_lenient
from flax_transformer.errors import DataError
from flax_transformer.translation.translator import Translator


def wanted(flag: bool | None, input_path: str, stdin=None, batch_only=()) -> bool:
  """--interactive or --nointeractive as given (`flag`); unset (None): when the input is
  stdin, stdin is a terminal, and none of the batch-only flags' values is set."""
  if flag is not None:
    return flag
  stdin = stdin or sys.stdin
  return input_path == "-" and stdin.isatty() and not any(batch_only)


def run_interactive(*, workdir: str, output_path: str, compilation_cache_dir: str = "",
                    stdin: BinaryIO | None = None, source_lang: str | None = None,
                    target_lang: str | None = None, split_sentences: bool = False,
                    **from_workdir) -> None:
  """Reads stdin a line at a time; writes each line's translation (nbest: K lines
  'index ||| translation ||| score', as decode.py; `split_sentences`: the line a text of
  sentences, as decode.py --split_sentences) and flushes it before reading on.

  Each line is its own batch of one row per device (no waiting for a batch to
  fill); `from_workdir` goes to `Translator.from_workdir`, its batch_tokens aside;
  source_lang, target_lang: the direction, checked first (translate.direction_of).
  """
  direction = direction_of(workdir, source_lang, target_lang)
  from_workdir["batch_tokens"] = 1  # Rows per batch: one per device, the fewest.
  translator = Translator.from_workdir(workdir, **from_workdir)
  compilation.enable_cache(compilation_cache_dir)  # Before the first search compiles.
  nbest = translator.search.nbest
  if split_sentences and nbest > 1:
    raise DataError("--split_sentences translates whole texts: drop --nbest")
  stdin = stdin or sys.stdin.buffer
  out: TextIO = sys.stdout if output_path == "-" else open(output_path, "w", encoding="utf-8",
                                                             newline="")  # Endings as written.
  logging.info("Interactive: one translation per input line, as each line arrives")
  try:
    for index, raw in enumerate(iter(stdin.readline, b"")):
      lines, invalid = split_lines_lenient(raw)
      if invalid:
        logging.warning("input line %d is not valid UTF-8 (bad bytes replaced)", index + 1)
      if split_sentences:  # Its sentences, kept pieces in place (Translator.translate_texts).
        text = translator.translate_texts(lines or [""], direction.get("source_lang") or "en",
                                          target_lang=direction.get("target_lang"))[0]
        out.write(one_line(text) + line_endings(raw)[0])
      else:
        hyps = translator.translate_nbest(lines or [""], **direction)[0]
        out.writelines(output_lines(index, hyps, nbest, line_endings(raw)[0]))
      out.flush()
  except KeyboardInterrupt:  # Ctrl-C is how a user leaves the loop: no traceback.
    raise SystemExit(130) from None
  finally:
    if out is not sys.stdout:
      out.close()


def check_flags(**given) -> None:
  """The batch-only flags (name -> value) cannot go with --interactive."""
  clash = [name for name, value in given.items() if value]
  if clash:
    raise DataError(f"--interactive translates stdin line by line: drop {', '.join(clash)}")
