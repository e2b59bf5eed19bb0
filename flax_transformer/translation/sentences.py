"""Long texts as model inputs: each text split into sentences (sentencex), each sentence
longer than the model takes cut at its limit, one with no letter left as it is, the URLs,
e-mail addresses, @mentions, #hashtags and emoji within one, and its words with a character
the model cannot spell (`Unknown`), passed around the model and put back where they stood
in its translation (inline_runs.TextRun: format=html's mechanism; a model without them in
its vocabulary would drop them), and the translations joined back with the text's own
whitespace and newlines. serve.py's
LibreTranslate face, the Translator and decode.py --split_sentences use it.

sentencex, chosen by bench/sentence_split.py (results/bench/sentence_split.json): as
accurate as pysbd on Multi30k-like and news-like EN/DE/FR paragraphs, ~500x faster, no
dependencies, and a fallback for languages it has no rules for.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Callable, Iterator, Sequence

from flax_transformer.translation.inline_runs import TextRun

log = logging.getLogger("flax_transformer.sentences")
NEWLINES = re.compile(r"(\s*\n\s*)")  # Always a boundary, kept as it is.
UNKNOWN = "<unk>"  # The unknown piece of every tokenizer kind (trained, imported).


def split(text: str, language: str) -> list[str]:
  """`text` as [space, sentence, space, ..., sentence, space]: its sentences at odd
  indices, stripped, and what lies between them (whitespace, newlines, "" between
  sentences the splitter found with no space) at even ones: "".join(parts) == text.
  A newline always ends a sentence. `language`: an ISO 639 code, or a model's own for
  it ('deu_Latn', 'deu': German's rules, as 'de')."""
  import sentencex  # Imported on use: decode.py without --split_sentences never needs it.

  from flax_transformer.language_codes import iso_form

  language = iso_form(language)

  parts, gap = [], ""
  for i, chunk in enumerate(NEWLINES.split(text)):
    if i % 2:
      gap += chunk
      continue
    at = 0
    for piece in sentencex.segment(language, chunk):
      sentence = piece.strip()
      start = chunk.find(sentence, at) if sentence else -1
      if start < 0:  # Nothing, or text the splitter changed: left to the next sentence.
        continue
      parts += [gap + chunk[at:start], sentence]
      gap, at = "", start + len(sentence)
    if chunk[at:].strip():  # Text the splitter left out (never seen): a sentence of its own.
      rest = chunk[at:]
      parts += [gap + rest[:len(rest) - len(rest.lstrip())], rest.strip()]
      gap, at = "", len(chunk) - (len(rest) - len(rest.rstrip()))
    gap += chunk[at:]
  return parts + [gap]


def cut(sentence: str, most: int, length_of: Callable[[str], int]) -> list[str]:
  """`sentence` in pieces of at most `most` tokens (`length_of`: a text's tokens): itself
  if it fits, else the longest word prefix that fits (or characters, for one word over
  the limit), then the rest likewise, with a warning in the log. Nothing is dropped."""
  if length_of(sentence) <= most:
    return [sentence]
  log.warning("A sentence of %d tokens is over the limit of %d: translated in pieces cut "
              "at the limit: %.80r", length_of(sentence), most, sentence)
  pieces, rest = [], sentence
  while rest:
    if length_of(rest) <= most:
      return pieces + [rest]
    words = rest.split(" ")
    count = _longest(len(words), lambda n: length_of(" ".join(words[:n])) <= most)
    if count:
      head, rest = " ".join(words[:count]), " ".join(words[count:]).lstrip()
    else:  # One word over the limit: as many characters as fit (at least one).
      size = max(1, _longest(len(words[0]), lambda n: length_of(rest[:n]) <= most))
      head, rest = rest[:size], rest[size:].lstrip()
    pieces.append(head)
  return pieces


def _longest(top: int, fits: Callable[[int], bool]) -> int:
  """The largest n in [0, top] with fits(n) (fits is monotone; fits(0) assumed)."""
  low, high = 0, top
  while low < high:
    middle = (low + high + 1) // 2
    low, high = (middle, high) if fits(middle) else (low, middle - 1)
  return low


@dataclasses.dataclass(frozen=True)
class Layout:
  """One text as model inputs: `parts` as `split`'s, per sentence the number of inputs
  it was cut into, and its TextRun if it holds pieces kept from the model (else None)."""
  parts: list[str]
  pieces: list[int]
  runs: list[TextRun | None]

  def join(self, outputs: Iterator[str]) -> str:
    """The text with each sentence replaced by its pieces' translations (taken from
    `outputs` in order, a space between pieces, its kept pieces put back); a sentence of
    no pieces as it is. One translated as nothing leaves one of the two spaces around it
    (the one with the most newlines, else the shorter: "A. B. C." -> "X.  Z." no more)."""
    counts, runs = iter(self.pieces), iter(self.runs)

    def sentence(part: str) -> str:
      count, run = next(counts), next(runs)
      if not count:
        return part
      said = [text for text in (next(outputs) for _ in range(count)) if text.strip()]
      return run.render(" ".join(said)) if run else " ".join(said)

    done = [sentence(part) if i % 2 else part for i, part in enumerate(self.parts)]
    for i in range(1, len(done), 2):
      if not done[i].strip():
        done[i - 1:i + 2] = ["", "", min(done[i - 1], done[i + 1],
                                         key=lambda gap: (-gap.count("\n"), len(gap)))]
    return "".join(done)


class Unknown:
  """Whether `tokenizer` cannot spell a character: it maps it to its unknown piece (what
  the model reads as '<unk>', and writes back as nothing). Cached per character."""

  def __init__(self, tokenizer):
    self._tokenizer = tokenizer
    self._known: dict[str, bool] = {}

  def __call__(self, char: str) -> bool:
    if char not in self._known:
      self._known[char] = UNKNOWN in self._tokenizer.pieces(self._tokenizer.tokenize(char))
    return self._known[char]


def layout(texts: Sequence[str], language: str, most: int, length_of: Callable[[str], int],
           sentences: bool = True, unknown: Callable[[str], bool] | None = None
           ) -> tuple[list[str], list[Layout]]:
  """The model inputs of `texts` (in order) and each text's Layout. `sentences` False:
  a line is one sentence (only newlines split), cut all the same. A sentence with no
  letter (emoji, numbers, punctuation: '🎉', '12:30', '1.') is no input: a model has
  nothing to translate there and would make words up; it is written back as it is. A
  sentence's URLs, e-mail addresses, mentions and emoji are no input either (TextRun),
  nor its words with a character the model cannot spell (`unknown`, an `Unknown`): the
  model translates the words around them, and they go back in place."""
  inputs, layouts = [], []
  for text in texts:
    parts = split(text, language) if sentences else _lines(text)
    counts, runs = [], []
    for sentence in parts[1::2]:
      run = TextRun(sentence, unknown)
      run = run if run.inline else None
      prose = run.model_text if run else sentence
      pieces = cut(prose, most, length_of) if any(c.isalpha() for c in prose) else []
      inputs += pieces
      counts.append(len(pieces))
      runs.append(run)
    layouts.append(Layout(parts, counts, runs))
  return inputs, layouts


def _lines(text: str) -> list[str]:
  """`split`'s parts with a line (stripped) for a sentence."""
  parts, gap = [], ""
  for i, chunk in enumerate(NEWLINES.split(text)):
    if i % 2 or not chunk.strip():
      gap += chunk
      continue
    stripped = chunk.strip()
    start = chunk.find(stripped)
    parts += [gap + chunk[:start], stripped]
    gap = chunk[start + len(stripped):]
  return parts + [gap]


def join(layouts: Sequence[Layout], outputs: Sequence[str]) -> list[str]:
  """Each text's translation from the translations of `layout`'s inputs."""
  found = iter(outputs)
  return [each.join(found) for each in layouts]
