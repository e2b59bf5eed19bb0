"""format=html's parsing (flax_transformer/serving/markup.py): a page of Mastodon-like posts
keeps its markup, its mentions, hashtags, links and emoji; what must not be translated is
not; a malformed document comes back well-formed with all of its text (issue 78)."""

import re
from html.parser import HTMLParser

from flax_transformer.serving.markup import VOID, Document

# Mastodon's markup of a status (its HTML sanitizer's output): mentions and hashtags are
# links whose text is in their href, long URLs are shortened into invisible spans.
MASTODON = (
    '<p>Good morning <span class="h-card" translate="no"><a href="https://social.example/@anna" '
    'class="u-url mention">@<span>anna</span></a></span>! The dog runs in the park 🐕‍🦺 and '
    '<b>two <i>men</i> play</b> football.<br>Photos: <a href="https://example.org/photos/2024/'
    'park?id=1&amp;size=l" rel="nofollow noopener" target="_blank"><span class="invisible">'
    'https://</span><span class="ellipsis">example.org/photos/2024/</span><span class="invisible">'
    'park?id=1&amp;size=l</span></a></p><p>A cat sleeps. <a href="https://social.example/tags/'
    'cats" class="mention hashtag" rel="tag">#<span>cats</span></a> Tom &amp; Jerry &lt;3 '
    '<code>rm -rf</code> ok</p>')


class _Tags(HTMLParser):
  """The tag stream and the text of a document, and whether its tags nest."""

  def __init__(self, source: str):
    super().__init__(convert_charrefs=True)
    self.events, self.text, self.open, self.nested = [], [], [], True
    self.feed(source)
    self.close()

  def handle_starttag(self, tag, attrs):
    self.events.append((tag, attrs))
    if tag not in VOID:
      self.open.append(tag)

  def handle_endtag(self, tag):
    self.events.append("/" + tag)
    self.nested = self.nested and bool(self.open) and self.open.pop() == tag

  def handle_data(self, data):
    self.text.append(data)


def test_a_page_of_mastodon_posts_keeps_markup_mentions_hashtags_links_and_emoji():
  document = Document(MASTODON)
  # The mention, the emoji, the links and the <code> stay in their sentences, left as they
  # are: the <code>'s text is translated with its sentence, and found there; the model
  # reads one space where a kept one stood between words ("park and", not "park  and").
  assert document.texts == ["Good morning! The dog runs in the park and two men play "
                            "football.", "Photos: ", "A cat sleeps. Tom & Jerry <3 rm -rf ok",
                            "two men play", "men", "rm -rf"]
  out = document.render([text.upper() for text in document.texts])
  assert _Tags(out).events == _Tags(MASTODON).events  # Every tag and attribute, in place.
  assert "THE DOG RUNS IN THE PARK 🐕‍🦺 AND <b>TWO <i>MEN</i> PLAY</b> FOOTBALL.<br>" in out
  assert ">@<span>anna</span></a>" in out and ">#<span>cats</span></a>" in out
  assert "id=1&amp;size=l" in out and "TOM &amp; JERRY &lt;3 <code>rm -rf</code> OK" in out
  assert Document(MASTODON).render(Document(MASTODON).texts) == MASTODON


def test_code_pre_script_style_and_translate_no_are_left_as_they_are():
  source = ('<p>Run <code>ls -l</code> now.</p><pre>keep\n  this</pre><script>if (a<b) go();'
            '</script><style>p > b {color: red}</style><div translate="no">Name <b>Here</b></div>'
            '<p class="x notranslate">Brand</p><kbd>Ctrl</kbd>')
  document = Document(source)
  assert document.texts == ["Run ls -l now.", "ls -l"]  # Its sentence's words: in place.
  assert document.render(["Führe ls -l jetzt aus.", "ls -l"]) == source.replace(
      "Run <code>ls -l</code> now.", "Führe <code>ls -l</code> jetzt aus.")


def test_a_malformed_document_comes_back_well_formed_with_all_of_its_text():
  """As a browser reads it (html5lib, the WHATWG algorithm): the <b><i> left open by
  </div> go on after it (the adoption agency's reconstruction), a stray </span> is
  dropped, <li> and <p> close their open siblings; the cut-off "<span" is text."""
  source = ('<div>Unclosed <b>bold <i>both</div> stray</span> end <ul><li>one<li>two</ul>'
            '<p>a<p>b &amp; c <img src="x.png" alt="a &quot;b&quot;"><span')
  document = Document(source)
  out = document.render(document.texts)
  tags = _Tags(out)
  assert tags.nested and not tags.open  # Every element closed, in order.
  assert "".join(tags.text) == "".join(_Tags(source).text)  # The cut-off "<span" too.
  assert out == ('<div>Unclosed <b>bold <i>both</i></b></div><b><i> stray end <ul><li>one'
                 '</li><li>two</li></ul><p>a</p><p>b &amp; c <img src="x.png" alt="a &quot;b'
                 '&quot;">&lt;span</p></i></b>')


def test_overlapping_tags_keep_what_a_browser_renders():
  """<b>a <i>b</b> c</i>: a browser renders "c" in italics (the adoption agency
  algorithm reopens <i> after </b>); the document comes back nested, italics kept."""
  document = Document("<b>a <i>b</b> c</i>")
  assert document.render(document.texts) == "<b>a <i>b</i></b><i> c</i>"
  out = document.render([text.upper() for text in document.texts])
  assert out == "<b>A <i>B</i></b><i> C</i>" and _Tags(out).nested


def test_comments_are_never_translated_an_unclosed_one_either():
  """An unclosed <!-- runs to the end of the document (HTML's tokenizer): a comment,
  not text; it comes back closed and as written."""
  document = Document("<p>Hello <!-- do not translate this <b>note</b>")
  assert document.texts == ["Hello "]
  assert document.render(["Hallo "]) == "<p>Hallo <!-- do not translate this <b>note</b>--></p>"
  assert Document("a <!-- b --> c").texts == ["a ", " c"]


def test_entities_come_back_as_the_characters_they_stand_for_markup_escaped():
  """As LibreTranslate's answer (BeautifulSoup's html.parser, then html.unescape):
  &nbsp; &copy; &#8212; come back as their characters, in text and attributes; &amp;
  &lt; &gt; stay escaped (unescaped, text would turn into markup). An attribute keeps
  what a browser reads in it: "&copy=2" in a URL is no entity there (HTML's legacy
  rule), so the link still goes to ?a=1&copy=2."""
  source = ('<p title="x&nbsp;y &amp; z">10&nbsp;km &amp; &copy; &#8212; &lt;b&gt; '
            '<a href="/x?a=1&copy=2&amp;b=3">here</a></p>')
  document = Document(source)
  assert document.texts == ["10\xa0km & \u00a9 \u2014 <b> here", "here"]
  out = document.render(document.texts)
  assert out == ('<p title="x\xa0y &amp; z">10\xa0km &amp; \u00a9 \u2014 &lt;b&gt; '
                 '<a href="/x?a=1&amp;copy=2&amp;b=3">here</a></p>')
  assert _Tags(out).events[1] == ("a", [("href", "/x?a=1&copy=2&b=3")])


def test_an_inline_tag_inside_a_sentence_does_not_cut_it():
  """<p>The <b>red</b> car is fast.</p> is one sentence to translate, not "The", "red"
  and "car is fast."; the <b> goes around the words of the translation that its own
  text's translation is (as written, or the most similar ones: "rot" -> "rote"), or,
  not found, around the words where it stood, in proportion. No tag and no word of the
  translation lost."""
  source = '<p>The <b>red</b> car is <a href="/cars">very <i>fast</i></a>.</p>'
  document = Document(source)
  assert document.texts == ["The red car is very fast.", "red", "very fast", "fast"]
  german = ["Das rote Auto ist sehr schnell.", "rot", "sehr schnell", "schnell"]
  assert document.render(german) == ('<p>Das <b>rote</b> Auto ist <a href="/cars">sehr '
                                     '<i>schnell</i></a>.</p>')
  repeated = "<p>x a <b>a <i>a</i></b> runs <em>a</em> <b>a</b></p>"  # Where each stood.
  assert Document(repeated).render(Document(repeated).texts) == repeated
  unfound = ["Der Wagen ist flink, sehr.", "blau", "xyz", "xyz"]
  out = document.render(unfound)
  assert _Tags(out).events == _Tags(source).events and _Tags(out).nested
  assert "".join(_Tags(out).text) == unfound[0]


def test_mentions_and_hashtags_whose_href_does_not_spell_their_text_are_kept():
  """Mastodon's TextFormatter (app/lib/text_formatter.rb, main at 039d555): a hashtag is
  <a href="#{tag_url}" class="mention hashtag">#<span>tag</span></a>, its href
  percent-encoded by Rails (#Müll -> /tags/M%C3%BCll); a mention is <span class="h-card">
  <a class="u-url mention">@<span>name</span></a></span> (no translate="no" there, and
  `pretty_acct` "bob@other.example" where the href is the profile's URL). Neither is
  prose: left as written, whatever its href."""
  source = ('<p>Heute <a href="https://social.example/tags/M%C3%BCll" class="mention hashtag" '
            'rel="tag">#<span>Müll</span></a> und <span class="h-card"><a href="https://other.'
            'example/@Bob" class="u-url mention">@<span>bob@other.example</span></a></span> '
            'sowie <a href="https://social.example/tags/CATS">#<span>cats</span></a></p>')
  document = Document(source)
  assert document.texts == ["Heute und sowie "]  # One sentence, the names in place.
  assert document.render(["Today and plus "]) == source.replace("Heute ", "Today ").replace(
      " und ", " and ").replace(" sowie ", " plus ")


def test_comments_doctype_and_foreign_content_come_back_as_a_browser_reads_them():
  """A document's doctype and comments are written back; SVG's and MathML's content is
  never translated (a CDATA section in it is its text, written escaped); a processing
  instruction is, as browsers read it, a comment. A document comes back a document."""
  source = ('<!DOCTYPE html><!-- note --><p>Text <svg><![CDATA[x < y && y > z]]></svg> more'
            '</p><?php echo 1 ?>')
  document = Document(source)
  assert document.texts == ["Text ", " more"]
  assert document.render(["A ", " B"]) == (
      '<!DOCTYPE html><!-- note --><html><head></head><body><p>A <svg>x &lt; y &amp;&amp; '
      'y &gt; z</svg> B</p><!--?php echo 1 ?--></body></html>')


def test_a_fragment_of_table_rows_or_cells_keeps_them():
  """A table's, a row's or a cell's innerHTML (what a browser extension sends of a page's
  table) is parsed within the element that holds it, as a browser parses it there: its
  rows and cells come back, each cell's text its own (a <div>'s fragment drops their tags,
  outside a table, and runs their texts together: "NameAge")."""
  cases = {
      '<td>Name</td><td>Age <b>now</b></td>': ["Name", "Age now", "now"],
      ' <tr><th>Name</th><th>Age</th></tr>\n<tr><td>Bob</td><td>42 km</td></tr>':
          ["Name", "Age", "Bob", "42 km"],
      '<tbody><tr><td>A cell</td></tr></tbody>': ["A cell"],
      '<!-- rows --><thead><tr><th>Head</th></tr></thead><tfoot><tr><td>Foot</td></tr>'
      '</tfoot>': ["Head", "Foot"],
  }
  for source, texts in cases.items():
    document = Document(source)
    assert document.texts == texts
    out = document.render([text.upper() for text in texts])
    assert _Tags(out).events == _Tags(source).events, out
    # The text upper-cased, each tag where it was.
    assert out == re.sub(r">([^<]+)<", lambda m: f">{m[1].upper()}<", source)


def test_a_page_with_a_comment_bom_or_xml_declaration_first_comes_back_a_page():
  """A whole page whose first line is a comment (a generator's note), a byte order mark
  or an XML declaration (XHTML), or that starts at <head> or <body>, is a document, not a
  fragment: its doctype, <html lang>, <head> and <body> and their attributes come back (at
  0d9b8db they were dropped: '<!-- x --><html lang="en">...' came back without them)."""
  body = ('<html lang="en"><head><meta charset="utf-8"><title>A dog</title></head>'
          '<body class="post"><p>A dog runs.</p></body></html>')
  for before in ("<!-- generated -->\n", "\ufeff<!DOCTYPE html>", "\ufeff",
                 '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n'):
    source = before + body
    document = Document(source)
    assert document.texts == ["A dog", "A dog runs."]
    out = document.render(["Ein Hund", "Ein Hund rennt."])
    assert out.endswith(body.replace("A dog", "Ein Hund").replace("runs.", "rennt.")), out
    assert ("<!DOCTYPE html>" in out) == ("DOCTYPE" in before)
  for source in ('<head><title>A dog</title></head><body class="post"><p>Hi</p></body>',
                 '<body class="post"><p>A dog runs.</p></body>'):
    out = Document(source).render(Document(source).texts)
    assert out.startswith("<html><head>") and '<body class="post"><p>' in out, out


def test_kept_inline_elements_stay_in_place_within_their_sentence():
  """<code>, <kbd>, <var>, <samp> and translate="no" inside a sentence do not cut it (at
  71e5e11 "Run " and " to list the files." went to the model apart): the sentence is
  translated with their text (a name, a command: words of it), and each comes back as it
  was where that text is in the translation (as written, else as translated alone);
  found nowhere, between the words nearest where it stood, no word of the translation
  dropped. At a sentence's end it stands for no text (the sentence as without it)."""
  code = "<p>Run <code>ls -l</code> to list the files.</p>"
  assert Document(code).texts == ["Run ls -l to list the files.", "ls -l"]
  placed = "<p>Führen Sie <code>ls -l</code> aus, um die Dateien aufzulisten.</p>"
  for own in ("ls -l", "LS -L"):  # The model copied it / wrote it as it does alone.
    german = [f"Führen Sie {own} aus, um die Dateien aufzulisten.", own]
    assert Document(code).render(german) == placed
  out = Document(code).render(["Führen Sie es aus, um die Dateien aufzulisten.", "xyz"])
  assert out == "<p>Führen <code>ls -l</code> Sie es aus, um die Dateien aufzulisten.</p>"
  name = '<p>Hello <span translate="no">Mastodon</span> friends, welcome.</p>'
  assert Document(name).texts == ["Hello Mastodon friends, welcome.", "Mastodon"]
  assert Document(name).render(["Hallo Mastodon-Freunde, willkommen.", "Mastodon"]) == (
      '<p>Hallo <span translate="no">Mastodon</span>-Freunde, willkommen.</p>')
  keys = "<p>Press <kbd>Ctrl</kbd> and <b>type <var>n</var></b> now.</p><p>See <samp>ok</samp></p>"
  document = Document(keys)
  assert document.texts == ["Press Ctrl and type n now.", "See ", "Ctrl", "type n", "n"]
  out = document.render(["Drücke Ctrl und tippe n jetzt.", "Siehe ", "Strg", "tippe n", "n"])
  assert out == ("<p>Drücke <kbd>Ctrl</kbd> und <b>tippe <var>n</var></b> jetzt.</p>"
                 "<p>Siehe <samp>ok</samp></p>")
  for source in (code, name, keys):
    assert Document(source).render(Document(source).texts) == source


def test_images_mentions_urls_and_emoji_within_a_sentence_do_not_cut_it():
  """An <img>, an empty inline element (an icon's <i></i>), a mention's or a hashtag's
  link, and a URL, @mention or emoji within text stand for no words: the sentence is
  translated around them as one (at 71e5e11: "A cat " and " sits on the mat." apart),
  and each goes back as it was, between the words nearest where it stood (split as the
  spaces around it were), or at the start or end if no letter stood between it and
  there. A <br> is a line break: it ends the sentence, as a newline does in format=text."""
  mention = ('<span class="h-card" translate="no"><a href="https://social.example/@anna" '
             'class="u-url mention">@<span>anna</span></a></span>')
  cases = {
      '<p>A cat <img src="c.png" alt="cat"> sits on the mat.</p>':
          (["A cat sits on the mat."], ["Eine Katze sitzt auf der Matte."],
           '<p>Eine Katze <img src="c.png" alt="cat"> sitzt auf der Matte.</p>'),
      f"<p>Thanks {mention} for the tip!</p>":
          (["Thanks for the tip!"], ["Danke für den Tipp!"],
           f"<p>Danke {mention} für den Tipp!</p>"),
      '<p><img src="a.png"> A dog <i class="icon"></i>runs 🐕 fast.</p>':
          ([" A dog runs fast."], [" Ein Hund rennt schnell."],
           '<p><img src="a.png"> Ein Hund <i class="icon"></i>rennt 🐕 schnell.</p>'),
      "<p>Hi @bob@x.org, see https://x.org/a now!</p>":
          (["Hi, see now!"], ["Hallo, siehe jetzt!"],
           "<p>Hallo @bob@x.org, siehe https://x.org/a jetzt!</p>"),
      # After an inline element's close, before punctuation: its space kept (was lost:
      # "<i>Hunde</i>@bob!").
      "<p><i>Dogs</i> @bob! Cats run.</p>":
          (["Dogs! Cats run.", "Dogs"], ["Hunde! Katzen rennen.", "Hunde"],
           "<p><i>Hunde</i> @bob! Katzen rennen.</p>"),
      "<p>Line one<br>line two</p>":
          (["Line one", "line two"], ["Zeile eins", "Zeile zwei"],
           "<p>Zeile eins<br>Zeile zwei</p>"),
  }
  for source, (texts, german, out) in cases.items():
    document = Document(source)
    assert document.texts == texts
    assert document.render(german) == out
    assert _Tags(out).nested and Document(source).render(Document(source).texts) == source


def _inputs(source: str) -> list[str]:
  """What serve.py's format=html gives the model for `source` (libretranslate._html: each
  of the document's texts split into sentences), and the document."""
  from flax_transformer.translation import sentences

  document = Document(source)
  return sentences.layout(document.texts, "en", 100, len)[0], document


def test_urls_links_and_images_leave_their_sentence_one_input_as_in_format_text():
  """A sentence reaches the model as format=text gives it ("See for details."), whatever
  kept piece stands in it: a link whose text is only a URL, its href another (a
  shortener's, "https://" where the text has "www."; it cut the sentence in two: "See"
  and "for details."); a URL in brackets within a text node (the model got "See () for
  details."); an <img> ("A cat  sits", two spaces). Each comes back as it was, in place."""
  cases = {
      '<p>See <a href="https://t.co/x">https://x.org</a> for details.</p>': "<a[^>]*>.*?</a>",
      '<p>See <a href="https://x.org/a">www.x.org/a</a> for details.</p>': "<a[^>]*>.*?</a>",
      "<p>See (https://x.org) for details.</p>": r"\(https://x.org\)",
      '<p>See <img src="x.png"> for details.</p>': "<img[^>]*>",
      # A link's or an inline element's URL alone in brackets: kept with them, as in text
      # (the link cut its sentence: "See", "for details.").
      '<p>See <a href="https://x.org">(https://x.org)</a> for details.</p>': r"<a[^>]*>\(",
      '<p>See <b>(https://x.org)</b> for details.</p>': r"<b>\(https://x.org\)</b>",
  }
  for source, kept in cases.items():
    inputs, document = _inputs(source)
    assert inputs == ["See for details."], source
    out = document.render(["Siehe für Details."])
    assert out == source.replace("See", "Siehe").replace("for details", "für Details"), out
    assert re.search(kept, out)
  inputs, document = _inputs('<p>A cat <img src="c.png"> sits on <b>the <img src="m.png"> '
                             'mat</b>.</p>')
  assert inputs == ["A cat sits on the mat.", "the mat"]
  assert document.render(["Eine Katze sitzt auf der Matte.", "der Matte"]) == (
      '<p>Eine Katze <img src="c.png"> sitzt auf <b>der <img src="m.png"> Matte</b>.</p>')
  # Within a word (a <wbr>, an icon glued to its words): no space where none stood.
  assert _inputs('<p>A super<wbr>cali dog runs.</p>')[0] == ["A supercali dog runs."]
  glued = '<p>A dog<i class="icon"></i>house stands.</p>'
  assert _inputs(glued)[0] == ["A doghouse stands."]
  assert Document(glued).render(Document(glued).texts) == glued


def test_a_sentence_translated_as_nothing_leaves_no_double_space():
  """A model that answers a sentence with nothing (the tiny model does, for some): its
  kept pieces come back with one space of the two around it ("<p> 😀</p>", "ZWEI.  KATZE
  <img>." before), as in format=text."""
  from flax_transformer.translation import sentences

  found, layouts = sentences.layout(Document("<p>A dog 😀</p>").texts, "en", 100, len)
  assert found == ["A dog"]
  assert Document("<p>A dog 😀</p>").render(sentences.join(layouts, [""])) == "<p>😀</p>"
  source = "<p>Two men play. A dog runs <img src='x.png'>. A cat.</p>"
  found, layouts = sentences.layout(Document(source).texts, "en", 100, len)
  assert found == ["Two men play.", "A dog runs.", "A cat."]
  out = Document(source).render(sentences.join(layouts, ["ZWEI.", "", "KATZE."]))
  assert re.sub(' ?<img src="x.png">', "", out) == "<p>ZWEI. KATZE.</p>" and "  " not in out
