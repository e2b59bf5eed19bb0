"""HTML for LibreTranslate's format=html: a document's text translated, its markup kept.

Parsed as browsers parse it (html5lib: the WHATWG algorithm, its recovery of malformed
markup included: overlapping tags are split as a browser renders them, `<li>one<li>two`
is two items, an unclosed comment runs to the end, entities in attributes follow HTML's
legacy rules), and written back well-formed by html5lib's serializer: tags, attributes
and nesting kept; entities come back as the characters they stand for, as LibreTranslate's
(BeautifulSoup's and html.unescape's) do, but `&amp;`, `&lt;` and `&gt;` (and `&quot;` in
attributes), which stay escaped so that text never turns into markup. A fragment (what
Mastodon and browser extensions send) comes back a fragment, parsed within the element a
browser would hold it in (a <div>; a table's rows and cells in theirs); a document
(`<!DOCTYPE`, `<html`, `<head` or `<body` first, after comments or an XML declaration)
a document. A start tag cut off at the end (`<span`) comes back as text.

Text is translated by blocks: a run of text and of the inline elements within it (`<b>`,
`<a href>`, nested `<i>`, ...) is one text to translate, so that an inline tag inside a
sentence does not cut it; each inline element's own text is translated too, and located
in its block's translation (where it is found as written, else the most similar words,
else where it stood, in proportion), and its tags put around what was found there. Runs
end at block elements, `<br>`, comments, and what is not translated. Left as they are:
the text of <code>, <pre>, <kbd>, <samp>, <var>, <textarea>, <script>, <style>, <svg>,
<math>, of an element with translate="no" (HTML's attribute) or class "notranslate", text
with no letter (emoji, numbers, punctuation), URLs, @mentions and #hashtags within text,
a link whose text is part of its href (percent-decoded, any case: Mastodon's
shortened-URL links) and a link of class "mention" or "hashtag" (Mastodon's).
"""

from __future__ import annotations

import difflib
import re
import urllib.parse
from xml.etree import ElementTree

import html5lib
from html5lib.constants import voidElements
from html5lib.serializer import HTMLSerializer

VOID = frozenset(voidElements)
KEEP = frozenset("code pre kbd samp var textarea script style svg math".split())
# Within a sentence: their text joins their block's (the others end a run).
INLINE = frozenset("a abbr b bdi bdo cite data del dfn em font i ins mark q s small span "
                   "strong sub sup time u".split())
# A link of one of these classes is a mention or a hashtag (Mastodon's, microformats'):
# its text is a name, whatever its href spells (percent-encoded, another case, a domain).
NAMES = frozenset(("mention", "hashtag"))
# Not prose, within text: URLs, @mentions (@bob, @bob@example.org), #hashtags, emoji runs.
PROTECTED = re.compile(r"(https?://\S+|www\.\S+|[@#][\w.@-]*\w|"
                       r"[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F\u200D]+)")
# A document: a doctype or <html>, <head> or <body> first (none is a fragment's), after
# comments, an XML declaration (XHTML) or spaces, if any.
DOCUMENT = re.compile(r"(?:\s|<!--.*?-->|<\?[^>]*>)*<(!doctype|(html|head|body)[\s>])",
                      re.IGNORECASE | re.S)
# A fragment is parsed within the element a browser would hold it in (its innerHTML):
# a <div>, but a table's rows, a row's cells, a table's parts within theirs, where a
# <div> would drop their tags and run the cells' texts together.
CONTAINERS = {"td": "tr", "th": "tr", "tr": "tbody", "tbody": "table", "thead": "table",
              "tfoot": "table", "caption": "table", "colgroup": "table", "col": "colgroup"}
FIRST_TAG = re.compile(r"(?:\s|<!--.*?-->)*<([A-Za-z][^\s/>]*)", re.S)  # Comments before.
CUT_OFF_TAG = re.compile(r"<(?=[A-Za-z/])[^<>]*\Z")  # A tag the input ends inside.
SIMILAR = 0.6  # difflib's ratio from which words are taken for an inline element's text.
WINDOW = 40  # Words either side of an inline element's place in proportion, searched.
_WALKER = html5lib.getTreeWalker("etree")


class _Gap:
  """A stretch of a text node within a run: its text as parsed, then as rendered."""

  def __init__(self, text: str):
    self.source = self.value = text


class _Inline:
  """An inline element within a run: it opens before gap `first` and closes before gap
  `last` (its content: gaps first..last-1); `parent`: the index of the one around it."""

  def __init__(self, first: int, parent: int | None):
    self.first, self.last, self.parent = first, first, parent


class _Run:
  """Text translated as one: its gaps (text between tags) and its inline elements."""

  def __init__(self):
    self.gaps: list[_Gap] = []
    self.inline: list[_Inline] = []
    self.open: list[int] = []  # Inline elements open at the end, innermost last.

  @property
  def text(self) -> str:
    return "".join(gap.source for gap in self.gaps)

  def span(self, element: _Inline) -> tuple[int, int]:
    """Where `element`'s text is in the run's text."""
    start = sum(len(gap.source) for gap in self.gaps[:element.first])
    return start, start + sum(len(gap.source) for gap in self.gaps[element.first:element.last])

  def translated(self) -> bool:
    return _prose(self.text)


def _prose(text: str) -> bool:
  return any(c.isalpha() for c in text)


def _element(node) -> bool:
  """An element (not a comment, a doctype or a processing instruction)."""
  return isinstance(node.tag, str) and not node.tag.startswith(("<", "DOCUMENT"))


def _readable(href: str | None) -> str | None:
  """An href as its text would spell it: percent-decoded, case-folded."""
  return None if href is None else urllib.parse.unquote(href).casefold()


def _all_text(element) -> str:
  return "".join(element.itertext())


def _kept(element) -> bool:
  """Whether an element's text is left as it is (module docstring)."""
  classes = set((element.get("class") or "").split())
  if (element.tag in KEEP or element.tag.startswith("{")  # SVG's, MathML's: not HTML.
      or (element.get("translate") or "").lower() == "no" or "notranslate" in classes):
    return True
  if element.tag != "a":
    return False
  text, href = _all_text(element).strip().casefold(), _readable(element.get("href"))
  return bool(classes & NAMES) or bool(text and href and text in href)


def _joinable(element) -> bool:
  """An inline element whose text can join its block's: inline all through, with text,
  nothing kept, no comment, no URL, mention, hashtag or emoji within."""
  for node in element.iter():
    if not _element(node) or node.tag not in INLINE or _kept(node):
      return False
  text = _all_text(element)  # "#<span>cats</span>": a hashtag across its tags.
  return bool(text.strip()) and not PROTECTED.search(text)


class _Reader:
  """Walks a parsed tree into runs, and the text slots (an element's text or tail) with
  what they are made of: fixed strings and gaps of runs."""

  def __init__(self):
    self.runs: list[_Run] = []
    self.slots: list[tuple[object, str, list]] = []
    self.run: _Run | None = None

  def cut(self) -> None:
    self.run = None

  def text(self, node, attribute: str, href: str | None) -> None:
    """Places node.text or node.tail: gaps of the current run, and what is not prose."""
    text = getattr(node, attribute) or ""
    parts: list = []
    self.slots.append((node, attribute, parts))
    if href and text.strip() and text.strip().casefold() in href:
      self.cut()
      parts.append(text)
      return
    for i, piece in enumerate(PROTECTED.split(text)):
      if i % 2:
        self.cut()
        parts.append(piece)
        continue
      if self.run is None:
        self.run = _Run()
        self.runs.append(self.run)
      gap = _Gap(piece)  # Even empty: runs alternate gaps and tags.
      self.run.gaps.append(gap)
      parts.append(gap)

  def walk(self, element, href: str | None) -> None:
    """`element`'s text, then each child's (in runs), then each child's tail."""
    self.text(element, "text", href)
    for child in element:
      if _element(child) and not _kept(child) and _joinable(child):
        run = self.run
        run.inline.append(_Inline(len(run.gaps), run.open[-1] if run.open else None))
        run.open.append(len(run.inline) - 1)
        self.walk(child, _readable(child.get("href")) if child.tag == "a" else href)
        run.inline[run.open.pop()].last = len(run.gaps)
      else:
        self.cut()
        if _element(child) and not _kept(child):
          self.walk(child, _readable(child.get("href")) if child.tag == "a" else href)
          self.cut()
      self.text(child, "tail", href)


def _parse(source: str):
  """The tree a browser builds (a fragment's, or a document's with its doctype)."""
  if source.rfind("<!--") <= source.rfind("-->"):  # Not within a comment left open.
    source = CUT_OFF_TAG.sub(lambda m: "&lt;" + m.group()[1:], source)
  if DOCUMENT.match(source):
    builder = html5lib.getTreeBuilder("etree", fullTree=True)
    return html5lib.HTMLParser(tree=builder, namespaceHTMLElements=False).parse(source)
  first = FIRST_TAG.match(source)
  container = CONTAINERS.get(first[1].lower(), "div") if first else "div"
  return html5lib.parseFragment(source, container=container, treebuilder="etree",
                                namespaceHTMLElements=False)


def _words(text: str, start: int, end: int) -> list[tuple[int, int]]:
  return [(m.start(), m.end()) for m in re.finditer(r"\S+", text[:end]) if m.start() >= start]


def _found(text: str, wanted: list[str], start: int, end: int, near: int, whole: bool
           ) -> tuple[int, int] | None:
  """Where in text[start:end] one of `wanted` is, as written (nearest `near`; `whole`: as
  whole words), or else in the most similar run of words (difflib's ratio, case-folded,
  SIMILAR at least)."""
  for want in wanted:
    hits = [m.start() for m in re.finditer(f"(?={re.escape(want)})", text[:end])  # Overlapping.
            if m.start() >= start
            and not (whole and _inside_word(text, m.start(), m.start() + len(want)))]
    if want.strip() and hits:
      at = min(hits, key=lambda hit: abs(hit - near))
      return at, at + len(want)
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


def _placed(run: _Run, translation: str, own: list[str]) -> list[tuple[int, int]]:
  """Where each inline element of `run` goes in its `translation` (`own`: each one's own
  translation), within its parent's place and after its previous sibling's."""
  spans: list[tuple[int, int]] = []
  source, last_end = run.text, {}
  for k, element in enumerate(run.inline):
    parent_src = (0, len(source)) if element.parent is None else run.span(
        run.inline[element.parent])
    top, hi = (0, len(translation)) if element.parent is None else spans[element.parent]
    lo = max(top, last_end.get(element.parent, top))  # After its previous sibling.
    begin, finish = run.span(element)
    scale = (hi - top) / max(1, parent_src[1] - parent_src[0])
    near = max(lo, top + round((begin - parent_src[0]) * scale))
    written = source[begin:finish]
    where = _found(translation, [own[k], written, own[k].strip(), written.strip()], lo, hi,
                   near, not _inside_word(source, begin, finish))
    if where is None:
      where = _in_proportion(translation, near, top + round((finish - parent_src[0]) * scale),
                             lo, hi)
    spans.append(where)
    last_end[element.parent] = where[1]
  return spans


def _fill(run: _Run, translation: str, spans: list[tuple[int, int]]) -> None:
  """Each gap's text: the translation between the tags around it."""
  cuts = [None] * (len(run.gaps) + 1)
  cuts[0], cuts[-1] = 0, len(translation)
  for element, (start, end) in zip(run.inline, spans):
    cuts[element.first], cuts[element.last] = start, end
  for i in range(1, len(cuts)):  # A gap between two closes, or two opens: as wide as 0.
    cuts[i] = cuts[i - 1] if cuts[i] is None else max(cuts[i], cuts[i - 1])
  for i, gap in enumerate(run.gaps):
    gap.value = translation[cuts[i]:cuts[i + 1]]


class Document:
  """An HTML document or fragment: `texts` to translate, and `render(translations)`."""

  def __init__(self, source: str):
    # A byte order mark is no text (a browser drops it): written back where it was.
    self._bom = "\ufeff" if source.startswith("\ufeff") else ""
    self._tree = _parse(source[len(self._bom):])
    reader = _Reader()
    reader.walk(self._tree, None)
    self._slots = reader.slots
    self._runs = [run for run in reader.runs if run.translated()]

  @property
  def prose(self) -> str:
    """The document's text to translate, its runs joined by spaces (its language's)."""
    return " ".join(run.text for run in self._runs)

  @property
  def texts(self) -> list[str]:
    """Each run's text, then each inline element's within them (to locate them)."""
    return [run.text for run in self._runs] + [
        run.text[slice(*run.span(e))] for run in self._runs for e in run.inline]

  def render(self, translations: list[str]) -> str:
    """The document with its texts replaced by `translations` (in `texts`' order)."""
    own = iter(translations[len(self._runs):])
    for run, translation in zip(self._runs, translations):
      _fill(run, translation, _placed(run, translation, [next(own) for _ in run.inline]))
    for node, attribute, parts in self._slots:
      setattr(node, attribute, "".join(p if isinstance(p, str) else p.value for p in parts))
    serializer = HTMLSerializer(quote_attr_values="always", omit_optional_tags=False,
                                use_trailing_solidus=False, inject_meta_charset=False,
                                quote_char='"')
    return self._bom + "".join(serializer.serialize(_WALKER(self._tree)))
