"""HTML for LibreTranslate's format=html: a document's text translated, its markup kept.

Parsed by the standard library's html.parser (a tolerant tokenizer of HTML as browsers
write it, no dependency; the tree is rebuilt here, which a malformed document needs
anyway): tags, attributes (re-quoted), comments and declarations come back as they were,
inline tags (<b>, <a href>, <br>, nested spans) where they were, each text node
translated on its own (its sentences split as plain text's). Left as they are: the text
of <code>, <pre>, <kbd>, <samp>, <var>, <textarea>, <script>, <style>, of an element with
translate="no" (HTML's attribute) or class "notranslate", text with no letter (emoji,
numbers, punctuation), URLs, @mentions and #hashtags within text, a link's text that is
part of its href (percent-decoded, any case: Mastodon's shortened-URL links) and the text
of a link of class "mention" or "hashtag" (Mastodon's mentions and hashtags).

A malformed document comes back well-formed: an end tag with no open element is
dropped, one that closes an element with others open inside closes those too, elements
left open are closed at the end; no text is dropped.
"""

from __future__ import annotations

import html
import re
import urllib.parse
from html.parser import HTMLParser

VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
KEEP = frozenset("code pre kbd samp var textarea script style".split())
RAW = frozenset(("script", "style"))  # Their text is not HTML: written back unescaped.
# A link of one of these classes is a mention or a hashtag (Mastodon's, microformats'):
# its text is a name, whatever its href spells (percent-encoded, another case, a domain).
NAMES = frozenset(("mention", "hashtag"))
# An open one is closed by the start of another (<li>one<li>two: two items, as browsers).
SIBLINGS = frozenset("p li dt dd option tr td th".split())
# Not prose, within text: URLs, @mentions (@bob, @bob@example.org), #hashtags, emoji runs.
PROTECTED = re.compile(r"(https?://\S+|www\.\S+|[@#][\w.@-]*\w|"
                       r"[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F\u200D]+)")


class _Text:
  """A translatable text node: its text as parsed (entities decoded)."""

  def __init__(self, text: str):
    self.text = text


class _Parser(HTMLParser):
  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.items: list[str | _Text] = []  # Markup (already HTML) and text to translate.
    self.open: list[tuple[str, bool, str | None]] = []  # (tag, kept as is, href of an <a>)
    self.data: list[str] = []  # Text not yet placed: the parser hands a text node in pieces.

  def _kept(self) -> bool:
    return bool(self.open) and self.open[-1][1]

  def handle_starttag(self, tag, attrs):
    self.flush()
    if tag in SIBLINGS and self.open and self.open[-1][0] == tag:
      self.handle_endtag(tag)
    self.items.append(_start(tag, attrs))
    if tag in VOID:
      return
    named = dict(attrs)
    classes = set((named.get("class") or "").split())
    kept = (self._kept() or tag in KEEP or (named.get("translate") or "").lower() == "no"
            or "notranslate" in classes or tag == "a" and bool(classes & NAMES))
    href = (_readable(named.get("href")) if tag == "a"
            else (self.open[-1][2] if self.open else None))
    self.open.append((tag, kept, href))

  def handle_startendtag(self, tag, attrs):
    self.handle_starttag(tag, attrs)
    if tag not in VOID:  # <span/> in HTML opens a span; written <span></span>.
      self.handle_endtag(tag)

  def handle_endtag(self, tag):
    self.flush()
    if tag in VOID or all(open_tag != tag for open_tag, _, _ in self.open):
      return  # A stray end tag: nothing to close.
    while True:
      open_tag, _, _ = self.open.pop()
      self.items.append(f"</{open_tag}>")
      if open_tag == tag:
        return

  def handle_data(self, data):
    self.data.append(data)

  def flush(self) -> None:
    """Places the text node read since the last tag."""
    data, self.data = "".join(self.data), []
    if not data:
      return
    tag = self.open[-1][0] if self.open else ""
    href = self.open[-1][2] if self.open else None
    if self._kept() or href and data.strip().casefold() in href:
      self.items.append(data if tag in RAW else html.escape(data, quote=False))
      return
    for i, piece in enumerate(PROTECTED.split(data)):
      if i % 2 or not any(c.isalpha() for c in piece):
        self.items.append(html.escape(piece, quote=False))
      else:
        self.items.append(_Text(piece))

  def handle_comment(self, data):
    self.flush()
    self.items.append(f"<!--{data}-->")

  def handle_decl(self, decl):
    self.flush()
    self.items.append(f"<!{decl}>")

  def handle_pi(self, data):
    self.flush()
    self.items.append(f"<?{data}>")

  def unknown_decl(self, data):
    self.flush()
    self.items.append(f"<![{data}]]>" if data.startswith("CDATA[") else f"<![{data}]>")


def _readable(href: str | None) -> str | None:
  """An href as its text would spell it: percent-decoded, case-folded."""
  return None if href is None else urllib.parse.unquote(href).casefold()


def _start(tag: str, attrs: list[tuple[str, str | None]]) -> str:
  written = "".join(f" {name}" if value is None else f' {name}="{html.escape(value)}"'
                    for name, value in attrs)
  return f"<{tag}{written}>"


class Document:
  """An HTML document or fragment: `texts` to translate, and `render(translations)`."""

  def __init__(self, source: str):
    parser = _Parser()
    parser.feed(source)
    parser.close()  # Text held back at the end (an unfinished tag, say) comes out here.
    parser.flush()
    if parser.open:
      parser.handle_endtag(parser.open[0][0])
    self._items = parser.items

  @property
  def texts(self) -> list[str]:
    return [item.text for item in self._items if isinstance(item, _Text)]

  def render(self, translations: list[str]) -> str:
    """The document with its texts replaced by `translations` (in `texts`' order)."""
    found = iter(translations)
    return "".join(html.escape(next(found), quote=False) if isinstance(item, _Text) else item
                   for item in self._items)
