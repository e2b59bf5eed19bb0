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
sentence does not cut it; each inline element's own text is translated too, and its tags
put around it in its block's translation (inline_runs.py says how it is found). Kept inline
elements (<code>, <kbd>, <samp>, <var>, translate="no" or class "notranslate" on an inline
element, mentions' and hashtags' links, an <img>, a <wbr>, an inline element with no text
or whose text is only URLs, mentions or emoji, as a link to a URL spelt out) and URLs,
e-mail addresses, @mentions, #hashtags and emoji within text (inline_runs.kept_spans: with
the brackets around one alone in them) do not cut it either: left as they are, in place in
their sentence, which reaches the model as format=text's would (Run.said: "A cat sits.",
not "A cat  sits." for "A cat <img> sits."; inline_runs.py). Runs end at block elements,
`<br>` (a line break: it ends a sentence, as a newline does in format=text), comments,
and the rest of what is not translated. Left as
they are: the text of <code>, <pre>, <kbd>, <samp>, <var>, <textarea>, <script>, <style>,
<svg>, <math>, of an element with translate="no" (HTML's attribute) or class "notranslate",
text with no letter (emoji, numbers, punctuation), URLs, e-mail addresses, @mentions and
#hashtags within text, a link whose text is part of its href (percent-decoded, any case:
Mastodon's shortened-URL links) and a link of class "mention" or "hashtag" (Mastodon's).

LibreTranslate (argos-translate-files 1.4.4's translatehtml, argos-translate 1.12's
tags.py) translates each text node alone: its tag injection, meant to translate a block as
one, never runs (its `depth()` counts no level), so that any tag, kept or not, cuts a
sentence there.
"""

from __future__ import annotations

import re
import urllib.parse
from xml.etree import ElementTree

import html5lib
from html5lib.constants import voidElements
from html5lib.serializer import HTMLSerializer

from flax_transformer.translation.inline_runs import (PROTECTED, Gap, Inline, Run, fill, has_letters,
                                                      kept_spans, placed)

VOID = frozenset(voidElements)
KEEP = frozenset("code pre kbd samp var textarea script style svg math".split())
# Within a sentence: their text joins their block's (the others end a run).
INLINE = frozenset("a abbr b bdi bdo cite data del dfn em font i ins mark q s small span "
                   "strong sub sup time u".split())
# Left as they are within a sentence, in place (its other kept elements: INLINE ones with
# translate="no", class "notranslate", mentions', hashtags' and URLs' links; and INLINE
# ones with no text, as an icon's <i></i>). A <br> is a line break: it ends the sentence,
# as a newline does in format=text.
PIECES = frozenset("code kbd samp var img wbr".split())
PIECE_WORDS = 4  # What a kept element stands for in its sentence: its text, if as short.
# A link of one of these classes is a mention or a hashtag (Mastodon's, microformats'):
# its text is a name, whatever its href spells (percent-encoded, another case, a domain).
NAMES = frozenset(("mention", "hashtag"))
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
_WALKER = html5lib.getTreeWalker("etree")


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


def _piece(element) -> str | None:
  """What a kept or empty inline element stands for in its sentence (module docstring),
  or None: it ends its run (not inline all through, or a text to translate)."""
  if not _element(element) or any(not _element(node) or node.tag not in INLINE | PIECES
                                  for node in element.iter()):
    return None
  if element.tag not in PIECES and not _kept(element) and _prose(_open_text(element)).strip():
    return None  # Words to translate: a joinable element's, or one ending its run.
  text = _all_text(element)
  if has_letters(text) and len(text.split()) <= PIECE_WORDS and not PROTECTED.search(text):
    return text  # A name, a command: words of the sentence.
  return ""  # An image, a mention, a URL, a long snippet: no words of the sentence.


def _split_kept(text: str) -> list[str]:
  """`text` cut at its kept pieces (kept_spans: "(https://x.org)" with its brackets), as
  re.split with a group cuts: prose, piece, prose, ..., prose."""
  cuts = [0, *(at for span in kept_spans(text) for at in span), len(text)]
  return [text[start:end] for start, end in zip(cuts, cuts[1:])]


def _prose(text: str) -> str:
  """`text` without its kept pieces: a link whose text is only a URL, href aside, has none."""
  return "".join(_split_kept(text)[::2])


def _open_text(element) -> str | None:
  """The text of an inline element, not kept, inline all through (kept or empty inline
  elements within counting as what they stand for), or None."""
  if not _element(element) or element.tag not in INLINE or _kept(element):
    return None
  parts = [element.text or ""]
  for child in element:
    inner = _open_text(child)
    inner = _piece(child) if inner is None else inner
    if inner is None:
      return None
    parts += [inner, child.tail or ""]
  return "".join(parts)


def _joinable(element) -> bool:
  """An inline element whose text can join its block's: inline all through, with text,
  nothing kept but in place, no comment, no URL, mention, hashtag or emoji within."""
  text = _open_text(element)  # "#<span>cats</span>": a hashtag across its tags.
  return bool(text and text.strip()) and not PROTECTED.search(text)


class _Reader:
  """Walks a parsed tree into runs, and the text slots (an element's text or tail) with
  what they are made of: fixed strings and gaps of runs."""

  def __init__(self):
    self.runs: list[Run] = []
    self.slots: list[tuple[object, str, list]] = []
    self.run: Run | None = None

  def cut(self) -> None:
    self.run = None

  def keep(self, stands_for: str) -> None:
    """A kept element or string in the current run, standing for `stands_for` there."""
    run = self.run
    if run is None:
      return
    run.inline.append(Inline(len(run.gaps), run.open[-1] if run.open else None, True))
    run.gaps.append(Gap(stands_for, kept=True))

  def text(self, node, attribute: str, href: str | None) -> None:
    """Places node.text or node.tail: gaps of the current run, and what is not prose."""
    text = getattr(node, attribute) or ""
    parts: list = []
    self.slots.append((node, attribute, parts))
    if href and text.strip() and text.strip().casefold() in href:
      self.cut()
      parts.append(text)
      return
    for i, piece in enumerate(_split_kept(text)):
      if i % 2:  # Left as it is, where it stands in its sentence ("(https://x.org)" too).
        parts.append(piece)
        self.keep("")
        continue
      if self.run is None:
        self.run = Run()
        self.runs.append(self.run)
      gap = Gap(piece)  # Even empty: runs alternate gaps and tags.
      self.run.gaps.append(gap)
      parts.append(gap)

  def walk(self, element, href: str | None) -> None:
    """`element`'s text, then each child's (in runs), then each child's tail."""
    self.text(element, "text", href)
    for child in element:
      stands_for = _piece(child) if self.run is not None else None
      if _element(child) and not _kept(child) and _joinable(child):
        run = self.run
        run.inline.append(Inline(len(run.gaps), run.open[-1] if run.open else None))
        run.open.append(len(run.inline) - 1)
        self.walk(child, _readable(child.get("href")) if child.tag == "a" else href)
        run.inline[run.open.pop()].last = len(run.gaps)
      elif stands_for is not None:  # Left as it is, where it stands in its sentence.
        self.keep(stands_for)
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
    for run in self._runs:
      run.settle()

  @property
  def prose(self) -> str:
    """The document's text to translate, its runs joined by spaces (its language's)."""
    return " ".join(run.prose for run in self._runs)

  @property
  def texts(self) -> list[str]:
    """Each run's text, then each inline element's within them (to locate them), but
    for kept elements standing for no text; as the model reads them (Run.said: one space
    where a kept element standing for nothing stood between words)."""
    return [run.said() for run in self._runs] + [
        run.said(e.first, e.last) for run in self._runs for e in run.inline if run.written(e)]

  def render(self, translations: list[str]) -> str:
    """The document with its texts replaced by `translations` (in `texts`' order)."""
    own = iter(translations[len(self._runs):])
    for run, translation in zip(self._runs, translations):
      mine = [next(own) if run.written(e) else "" for e in run.inline]
      fill(run, translation, placed(run, translation, mine))
    for node, attribute, parts in self._slots:
      setattr(node, attribute, "".join(p if isinstance(p, str) else p.value for p in parts))
    serializer = HTMLSerializer(quote_attr_values="always", omit_optional_tags=False,
                                use_trailing_solidus=False, inject_meta_charset=False,
                                quote_char='"')
    return self._bom + "".join(serializer.serialize(_WALKER(self._tree)))
