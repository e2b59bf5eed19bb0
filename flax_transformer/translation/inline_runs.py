"""A block's text and the inline elements within it, as one text to translate (a run), and
where each element goes in the run's translation: markup.py's runs (format=html).

An inline element with text to translate (<b>, <a href>) goes around its own translation
where found in its run's (as written, else the most similar words, else where it stood, in
proportion). A kept one (<code>, translate="no", an image, a mention, an emoji: markup.py
says which) is left as it is, in its sentence: it stands there for its text if a few words
of prose with letters on both sides of it in its run (a name, a command: the sentence is
translated with them, and the element takes the place of its text as written or as
translated alone, if found), else for nothing (the sentence is translated around it), and
it goes between the words nearest where it stood, in proportion, or at the run's start or
end when no letter stood between it and there. No word of the translation is dropped but
what a kept element stood for.

A plain text's sentence (format=text, decode.py --split_sentences: sentences.py) is a run
too (TextRun): its URLs, e-mail addresses, @mentions, #hashtags and emoji, and its words
with a character the model cannot spell, kept pieces standing for nothing, as within an
HTML text.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from typing import Callable

SIMILAR = 0.6  # difflib's ratio from which words are taken for an inline element's text.
WINDOW = 40  # Words either side of an inline element's place in proportion, searched.
# Not prose, within text: URLs, e-mail addresses, @mentions (@bob, @bob@example.org),
# #hashtags, emoji runs (a keycap, 1 U+FE0F U+20E3, and a flag's tag characters, U+E0020
# to U+E007F, within them). Left as they are, in place (a model without them in its
# vocabulary would drop them; one with them has nothing to translate there). A URL ends
# before the sentence's punctuation, holds only balanced parentheses and square brackets
# ("(see https://x.org/a_(b))": its ")" is the text's; "http://[::1]/") and no "<", ">",
# "{" or "}" (which a URL cannot hold unencoded: "<https://x.org>"'s are the text's);
# each starts where the one before could not (the lookbehinds): linear time, "@" * 5000
# included.
PROTECTED = re.compile(r"((?:https?://|www\.)(?:\([^\s()]*\)|\[[^\s\[\]]*\]|[^\s()\[\]<>{}])*"
                       r"(?:\([^\s()]*\)|\[[^\s\[\]]*\]|[^\s().,;:!?'\"\[\]<>{}“”‘’«»„])|"
                       r"(?<![\w.+-])[\w.+-]*\w@[\w-]+(?:\.[\w-]+)+|(?<![.@-])[@#][\w.@-]*\w|"
                       r"(?:[0-9#*]\uFE0F?\u20E3|[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF"
                       r"\uFE0F\u200D\u20E3\U000E0020-\U000E007F])+)")
SPACES = re.compile(r"\s+")
# Around a kept piece alone: kept with it (quotes too: the model got 'See " " now.').
BRACKETS = frozenset(("()", "[]", "<>", "{}", '""', "“”", "«»", "„“"))
# Between kept pieces, kept with them ("@bob, @alice"); no bracket or quote (Ps, Pe, Pi, Pf).
BETWEEN = frozenset(("Pc", "Pd", "Po", "Sc", "Sk", "Sm", "So"))
# Punctuation a word is written against: where a piece stood before it, no space.
CLOSING = frozenset(".,;:!?…)]}»”’。、，！？：；")


class Gap:
  """A stretch of a text node within a run: its text as parsed, then as rendered; or
  (`kept`) what a kept element stands for in its sentence, rendered as it is."""

  def __init__(self, text: str, kept: bool = False):
    self.source = self.value = text
    self.kept = kept


class Inline:
  """An inline element within a run: it opens before gap `first` and closes before gap
  `last` (its content: gaps first..last-1); `parent`: the index of the one around it.
  `kept`: left as it is, its one gap standing for it in the sentence."""

  def __init__(self, first: int, parent: int | None, kept: bool = False):
    self.first, self.last, self.parent, self.kept = first, first + kept, parent, kept


class Run:
  """Text translated as one: its gaps (text between tags) and its inline elements."""

  def __init__(self):
    self.gaps: list[Gap] = []
    self.inline: list[Inline] = []
    self.open: list[int] = []  # Inline elements open at the end, innermost last.

  @property
  def text(self) -> str:
    return "".join(gap.source for gap in self.gaps)

  def span(self, element: Inline) -> tuple[int, int]:
    """Where `element`'s text is in the run's text."""
    start = sum(len(gap.source) for gap in self.gaps[:element.first])
    return start, start + sum(len(gap.source) for gap in self.gaps[element.first:element.last])

  @property
  def prose(self) -> str:
    """Its text but what kept elements stand for."""
    return "".join(gap.source for gap in self.gaps if not gap.kept)

  def written(self, element: Inline) -> str:
    return self.text[slice(*self.span(element))]

  def said(self, first: int = 0, last: int | None = None, apart: bool = False) -> str:
    """What the model translates of gaps first..last-1: their text, where kept elements
    stand for nothing one space between two words, none before closing punctuation ("A
    cat <img> sits", "Hi @bob, see": "A cat sits", "Hi, see"; not "A cat  sits"), none
    where none stood ("super<wbr>cali") but with `apart` ("Dogs🐕run": "Dogs run"); its
    ends as they are."""
    text, cut = "", False
    for gap in self.gaps[first:last]:
      if gap.kept and not gap.source:
        cut = True
        continue
      words = gap.source
      if cut and text.strip() and words.strip():
        spaced = apart or text[-1].isspace() or words[0].isspace()
        text, words = text.rstrip(), words.lstrip()
        text += " " if spaced and words[0] not in CLOSING else ""
      cut = cut and not words.strip()
      text += words
    return text

  def translated(self) -> bool:
    return has_letters(self.prose)

  def settle(self) -> None:
    """A kept element with no letter before or after it in its run (at its sentence's
    start or end) stands for no text there: its sentence is translated as without it."""
    for i, gap in enumerate(self.gaps):
      before = "".join(g.source for g in self.gaps[:i] if not g.kept)
      after = "".join(g.source for g in self.gaps[i + 1:] if not g.kept)
      if gap.kept and not (has_letters(before) and has_letters(after)):
        gap.source = gap.value = ""


def has_letters(text: str) -> bool:
  return any(c.isalpha() for c in text)


def _words(text: str, start: int, end: int) -> list[tuple[int, int]]:
  return [(m.start(), m.end()) for m in re.finditer(r"\S+", text[:end]) if m.start() >= start]


def _found(text: str, wanted: list[str], start: int, end: int, near: int, whole: bool
           ) -> tuple[int, int] | None:
  """Where in text[start:end] one of `wanted` is, as written (`_exact`), or else in the
  most similar run of words (difflib's ratio, case-folded, SIMILAR at least)."""
  where = _exact(text, wanted, start, end, near, whole)
  if where is not None:
    return where
  words, best, where = _words(text, start, end), SIMILAR, None
  middle = min(range(len(words)), key=lambda i: abs(words[i][0] - near), default=0)
  for want in {w.strip().casefold() for w in wanted if w.strip()}:
    count, matcher = len(want.split()), difflib.SequenceMatcher(None, b=want)
    # Starting within WINDOW words of where it stood: a sentence's words move, not far.
    for i in range(max(0, middle - WINDOW), min(len(words), middle + WINDOW + 1)):
      for j in range(i + max(1, count - 2), min(len(words), i + count + 2) + 1):
        matcher.set_seq1(text[words[i][0]:words[j - 1][1]].casefold())
        if matcher.real_quick_ratio() < best or matcher.quick_ratio() < best:
          continue
        score = matcher.ratio()
        if score > best or score == best and where and abs(words[i][0] - near) < abs(
            where[0] - near):
          best, where = score, (words[i][0], words[j - 1][1])
  return where


def _exact(text: str, wanted: list[str], start: int, end: int, near: int, whole: bool
           ) -> tuple[int, int] | None:
  """Where in text[start:end] the first of `wanted` found is, as written (nearest `near`;
  `whole`: as whole words)."""
  for want in wanted:
    if not want.strip():  # Nothing to find (a kept piece's text): no scan of every position.
      continue
    hits = [m.start() for m in re.finditer(f"(?={re.escape(want)})", text[:end])  # Overlapping.
            if m.start() >= start
            and not (whole and _inside_word(text, m.start(), m.start() + len(want)))]
    if hits:
      at = min(hits, key=lambda hit: abs(hit - near))
      return at, at + len(want)
  return None


def _inside_word(text: str, start: int, end: int) -> bool:
  """Whether text[start:end] begins or ends within a word."""
  return (0 < start < len(text) and text[start - 1].isalnum() and text[start].isalnum()
          or 0 < end < len(text) and text[end - 1].isalnum() and text[end].isalnum())


def _in_proportion(text: str, start: int, end: int, lo: int, hi: int) -> tuple[int, int]:
  """The words of text[lo:hi] whose middles lie in [start, end], or the one nearest
  `start`: where an inline element stood, in proportion, none of its text found."""
  words = _words(text, lo, hi)
  inside = [w for w in words if start <= (w[0] + w[1]) / 2 <= end]
  if inside:
    return inside[0][0], inside[-1][1]
  if words:
    return min(words, key=lambda w: abs(w[0] - start))
  return lo, lo


def _anchor(source: str, span: tuple[int, int], parent: tuple[int, int], translation: str,
            lo: int, hi: int, near: int) -> int:
  """Where a kept element goes in translation[lo:hi] when none of its text is there
  (`parent`: where its source text may be, from its previous sibling's end to its parent's
  end): at the start (the end) if no letter or digit stood before (after) it, past what
  stood there if the translation has it too ("Hi <img>!": before the "!"); before the
  punctuation it stood before, if the translation has it ("it 😀, really": "es 😀,
  wirklich", not "es, 😀 wirklich"; its n-th "," if it has as many, else the one nearest
  `near`); else in the space between two words nearest
  `near`, split as the spaces around it were (at `near` if it stood within a word)."""
  before, after = source[parent[0]:span[0]], source[span[1]:parent[1]]
  mark = after.lstrip()  # Past the spaces between it and the pieces after it ("@bob 😀!").
  if not any(c.isalnum() for c in before):  # Digits too: "@bob 5 @alice" keeps its 5 between.
    return lo + len(before) if translation[lo:hi].startswith(before) else lo
  if not any(c.isalnum() for c in after):
    ends = [end for end in (after, mark) if end and translation[lo:hi].endswith(end)]
    return hi - len(ends[0]) if ends else hi
  marks = [lo + i for i, char in enumerate(translation[lo:hi]) if char == mark[:1]]
  if mark[:1] in CLOSING and marks:  # "it 😀, really": before the same "," there,
    if len(marks) == (before + after).count(mark[0]):  # counted, or the nearest.
      return marks[before.count(mark[0])]
    return min(marks, key=lambda mark: abs(mark - near))
  if not before[-1:].isspace() and not after[:1].isspace():  # Within a word ("x<wbr>y").
    return min(max(lo, near), hi)
  spaces = [(m.start(), m.end()) for m in SPACES.finditer(translation, lo, hi)
            if lo < m.start() and m.end() < hi]  # With a word on each side, within lo:hi.
  if not spaces:  # One word, or a script without spaces: before or after all of it.
    return lo if near - lo < hi - near else hi
  start, end = min(spaces, key=lambda space: min(abs(space[0] - near), abs(space[1] - near)))
  return start + min(len(before) - len(before.rstrip()), end - start)


def placed(run: Run, translation: str, own: list[str]) -> list[tuple[int, int]]:
  """Where each inline element of `run` goes in its `translation` (`own`: each one's own
  translation), within its parent's place and after its previous sibling's."""
  spans: list[tuple[int, int]] = []
  source, last_end, last_source_end = run.text, {}, {}
  for k, element in enumerate(run.inline):
    parent_src = (0, len(source)) if element.parent is None else run.span(
        run.inline[element.parent])
    top, hi = (0, len(translation)) if element.parent is None else spans[element.parent]
    lo = max(top, last_end.get(element.parent, top))  # After its previous sibling.
    begin, finish = run.span(element)
    scale = (hi - top) / max(1, parent_src[1] - parent_src[0])
    near = max(lo, top + round((begin - parent_src[0]) * scale))
    written = source[begin:finish]
    if element.kept or not written.strip():  # Its text as written, or as translated alone:
      wanted = [written, own[k], written.strip(), own[k].strip()]  # never a similar word's.
      where = _exact(translation, wanted, lo, hi, near, not _inside_word(source, begin, finish))
      if where is None:
        after_sibling = (last_source_end.get(element.parent, parent_src[0]), parent_src[1])
        at = _anchor(source, (begin, finish), after_sibling, translation, lo, hi, near)
        where = at, at
    else:
      where = _found(translation, [own[k], written, own[k].strip(), written.strip()], lo, hi,
                     near, not _inside_word(source, begin, finish))
    if where is None:
      where = _in_proportion(translation, near, top + round((finish - parent_src[0]) * scale),
                             lo, hi)
    spans.append(where)
    last_end[element.parent], last_source_end[element.parent] = where[1], finish
  return spans


def fill(run: Run, translation: str, spans: list[tuple[int, int]]) -> None:
  """Each gap's text: the translation between the tags around it."""
  cuts = [None] * (len(run.gaps) + 1)
  cuts[0], cuts[-1] = 0, len(translation)
  for element, (start, end) in zip(run.inline, spans):
    cuts[element.first], cuts[element.last] = start, end
  for i in range(1, len(cuts)):  # A gap between two closes, or two opens: as wide as 0.
    cuts[i] = cuts[i - 1] if cuts[i] is None else max(cuts[i], cuts[i - 1])
  for i, gap in enumerate(run.gaps):
    gap.value = translation[cuts[i]:cuts[i + 1]]
  _spaced(run, spans)


def _spaced(run: Run, spans: list[tuple[int, int]]) -> None:
  """A kept element placed with none of its text found is not glued to a word it was not
  glued to: a space on each side where one stood in its source ("Eine Katze <img> sitzt",
  "Sie schläft 😀.", not "Katze <img>sitzt", "schläft😀."), and, if it stood between
  words, where a letter or digit now stands and none did ("Hi 👋, how": "Hallo 👋 wie");
  the spaces between two placed at one place kept ("a@b.org 😀"), one if words stood
  between them ("Follow @bob and #tag": "@bob #tag Folgen", not "@bob#tag")."""
  source = run.text
  for element, (start, end) in zip(run.inline, spans):
    if not (element.kept and start == end):
      continue
    begin, finish = run.span(element)
    between = has_letters(source[:begin]) and has_letters(source[finish:])
    if element.first > 0:
      before = run.gaps[element.first - 1]
      if _glued(_last_char(run, element.first - 1), source[:begin][-1:], between):
        before.value += " "
    if element.last < len(run.gaps):
      after = run.gaps[element.last]
      if not after.value and after.source.isspace():  # Before another piece, at one place.
        after.value = after.source
      elif not after.value and element.last + 1 < len(run.gaps) and re.search(
          r"\s", after.source):  # Words between them translated elsewhere: one space.
        after.value = " "
      elif _glued(after.value[:1], after.source[:1], between):
        after.value = " " + after.value


def _last_char(run: Run, i: int) -> str:
  """The last character rendered up to gap `i`: its own, or (empty: between tags) that of
  the nearest text before it ("<i>dog</i> @bob!": the "g" before "</i>")."""
  while i > 0 and not run.gaps[i].value and not run.gaps[i].kept:
    i -= 1
  return run.gaps[i].value[-1:]


def _glued(now: str, was: str, between: bool) -> bool:
  """Whether the character `now` next to a kept element needs a space between them,
  `was` the one next to it in the source (`between`: it stood between words)."""
  return bool(now and was) and not now.isspace() and (
      was.isspace() or between and now.isalnum() and not was.isalnum())


def kept_spans(text: str, unknown: Callable[[str], bool] | None = None
               ) -> list[tuple[int, int]]:
  """Where text's PROTECTED pieces are, and (`unknown`: whether the model cannot spell a
  character) its words with a character the model cannot spell, each a run of letters,
  digits and such characters, with the punctuation within it ("Zoë", "$12.99" whole, for
  a vocabulary without "ë", "$"; an emoji is PROTECTED's, alone: "Dogs🐕run" keeps
  "🐕"); in order, those that overlap joined, and those with only punctuation and spaces
  between them (`_together`)."""
  spans = [m.span() for m in PROTECTED.finditer(text)]
  odd = sorted(c for c in set(text) if not c.isspace() and unknown and unknown(c)
               and not PROTECTED.fullmatch(c))
  if odd:
    chars = "".join(map(re.escape, odd))
    word = re.compile(rf"[\w{chars}]+(?:[.,:'’/-][\w{chars}]+)*")
    spans += [m.span() for m in word.finditer(text) if any(c in odd for c in m.group())]
  once = _joined(_bracketed(text, _joined(spans)))
  return _joined(_bracketed(text, _together(text, once), skip=set(once)))


def _bracketed(text: str, spans: list[tuple[int, int]], skip: set | frozenset = frozenset()
               ) -> list[tuple[int, int]]:
  """`spans`, one alone in brackets (not in `skip`) with them ("(https://x.org)"): the
  model gets no empty "()"."""
  return [(start - 1, end + 1) if (start, end) not in skip and 0 < start
          and text[start - 1] + text[end:end + 1] in BRACKETS else (start, end)
          for start, end in spans]


def _together(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """`spans` (in order, apart), those with only spaces and punctuation (BETWEEN, one mark
  at least, no sentence's end: an HTML text is split after) between them joined ("the
  @bob, @bob." reached the model as "the,.", its pieces came back after the ",.")."""
  joined: list[tuple[int, int]] = []
  for start, end in spans:
    between = text[joined[-1][1]:start] if joined else ""
    if between.strip() and not re.search(r"[.!?]\s|[。！？]", between) and all(
        c.isspace() or unicodedata.category(c) in BETWEEN and c not in "\"'" for c in between):
      joined[-1] = joined[-1][0], end
    else:
      joined.append((start, end))
  return joined


def _joined(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """`spans` in order, those that overlap joined."""
  joined: list[tuple[int, int]] = []
  for start, end in sorted(spans):
    if joined and start < joined[-1][1]:
      joined[-1] = joined[-1][0], max(end, joined[-1][1])
    else:
      joined.append((start, end))
  return joined


class TextRun(Run):
  """A plain text as a run: its prose in gaps, each kept piece (`kept_spans`) a kept
  element standing for nothing, put back as it is where it stood in `render`'s
  translation."""

  def __init__(self, text: str, unknown: Callable[[str], bool] | None = None):
    super().__init__()
    self.whole = text  # Its pieces included.
    self.pieces: list[str] = []
    at = 0
    for start, end in kept_spans(text, unknown):
      self.gaps.append(Gap(text[at:start]))
      self.inline.append(Inline(len(self.gaps), None, kept=True))
      self.gaps.append(Gap("", kept=True))
      self.pieces.append(text[start:end])
      at = end
    self.gaps.append(Gap(text[at:]))

  @property
  def model_text(self) -> str:
    """What the model translates: `said`, stripped ("A cat 😀 sleeps 😀." -> "A cat
    sleeps.")."""
    return self.said(apart=True).strip()

  def render(self, translation: str) -> str:
    """The text with `translation` (of `model_text`) for its prose, its pieces in place."""
    source = self.whole  # Its spaces at the ends, as found (not a piece's: "A 😀" for "").
    translation = (source[:len(source) - len(source.lstrip())] + translation
                   + source[len(source.rstrip()):])
    fill(self, translation, placed(self, translation, [""] * len(self.inline)))
    pieces = iter(self.pieces)
    return "".join(next(pieces) if gap.kept else gap.value for gap in self.gaps)
