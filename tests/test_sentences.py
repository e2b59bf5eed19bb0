"""Long texts as model inputs (flax_transformer/translation/sentences.py): sentences found
by sentencex, the text's own whitespace and newlines kept, over-long sentences cut at the
limit with a warning and nothing dropped (issue 78)."""

import logging

from flax_transformer.translation import sentences

NEWS_EN = ["Dr. Smith arrived in Washington on Monday at 10 a.m. local time.",
           "The U.S. economy grew by 3.5 percent last year, according to the report.",
           "\"We are very pleased,\" she said.", "Will the growth last?"]
NEWS_DE = ["Dr. Müller kam am 3. Mai nach Berlin.",
           "Die Wirtschaft wuchs um 3,5 Prozent, z. B. im Bau.",
           "„Wir sind sehr zufrieden“, sagte sie."]


def test_a_paragraph_splits_into_its_sentences_and_joins_back_with_its_own_spacing():
  text = "  " + "  ".join(NEWS_EN[:2]) + "\r\n\r\n" + " ".join(NEWS_EN[2:]) + "\n"
  parts = sentences.split(text, "en")
  assert parts[1::2] == NEWS_EN  # Abbreviations, decimals and quotes are not boundaries.
  assert parts[::2] == ["  ", "  ", "\r\n\r\n", " ", "\n"]
  assert "".join(parts) == text
  assert sentences.split(" ".join(NEWS_DE), "de")[1::2] == NEWS_DE
  # Each sentence through the "model" (upper case here), back in place.
  texts = [text, "", " \n ", "One line without a stop"]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == NEWS_EN + ["One line without a stop"]
  assert sentences.join(layouts, [s.upper() for s in inputs]) == [t.upper() for t in texts]
  # sentences=False: one input per line (decode.py's line-aligned files).
  inputs, layouts = sentences.layout([text], "en", 200, len, sentences=False)
  assert inputs == ["  ".join(NEWS_EN[:2]), " ".join(NEWS_EN[2:])]
  assert sentences.join(layouts, inputs) == [text]


def test_a_sentence_over_the_limit_is_cut_with_a_warning_and_nothing_dropped(caplog):
  words = lambda text: len(text.split())  # noqa: E731 - a token per word
  long = " ".join(f"w{i}" for i in range(23)) + "."
  with caplog.at_level(logging.WARNING, "flax_transformer.sentences"):
    pieces = sentences.cut(long, 10, words)
  assert [words(p) for p in pieces] == [10, 10, 3] and " ".join(pieces) == long
  assert "A sentence of 23 tokens is over the limit of 10" in caplog.text
  assert sentences.cut("abcdefg", 3, len) == ["abc", "def", "g"]  # One word over: characters.
  assert sentences.cut("short one.", 10, words) == ["short one."]
  inputs, layouts = sentences.layout([f"Hi there. {long}"], "en", 10, words)
  assert inputs == ["Hi there.", *pieces]
  assert sentences.join(layouts, inputs) == [f"Hi there. {long}"]


def test_decode_py_split_sentences_and_the_translators_texts(trained_tiny, tmp_path, caplog):
  """decode.py --split_sentences: a line of sentences translated sentence by sentence and
  joined on its line (without the flag, the line is one input, as before)."""
  import subprocess
  import sys

  import conftest
  from flax_transformer.translation.search_config import SearchConfig
  from flax_transformer.translation.translator import Translator

  said = ["A dog runs in the park.", "Two men are playing football.", "A woman reads a book."]
  (tmp_path / "in.en").write_text(f"{said[0]}  {said[1]}\n\n{said[2]}\n")
  (tmp_path / "lines.en").write_text("".join(f"{s}\n" for s in said))

  def decode(path, *flags):
    done = subprocess.run(
        [sys.executable, str(conftest.ROOT / "decode.py"), f"--workdir={trained_tiny}",
         f"--input={tmp_path / path}", "--max_extra=5", "--nointeractive",
         f"--compilation_cache_dir={conftest.XLA_CACHE}", *flags],
        capture_output=True, env=conftest.cpu_env(), text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout

  best = decode("lines.en").splitlines()  # The same sentences, a line each.
  split, plain = decode("in.en", "--split_sentences"), decode("in.en")
  assert split == f"{best[0]}  {best[1]}\n\n{best[2]}\n"
  assert plain.count("\n") == 3  # Off by default: a line is one input.
  # A Windows file's lines end as they did ("\r\n", not "\n"), one output line each; a
  # last line without a newline gets the one before's.
  (tmp_path / "crlf.en").write_bytes(f"{said[0]}  {said[1]}\r\n\r\n{said[2]}".encode())
  for flags, lf in ((["--split_sentences"], split), ([], plain)):
    decode("crlf.en", f"--output={tmp_path / 'out'}", *flags)
    assert (tmp_path / "out").read_bytes() == lf.replace("\n", "\r\n").encode()
  translator = Translator.from_workdir(trained_tiny, search=SearchConfig(max_extra=5))
  long = " ".join(["dog"] * (translator.max_len + 5))
  with caplog.at_level(logging.WARNING, "flax_transformer.sentences"):
    found = translator.translate_texts([f"{said[0]} {said[1]}", long], "en")
  assert found[0] == " ".join(translator.translate(said[:2])) and found[1].strip()
  assert f"over the limit of {translator.max_len}" in caplog.text


def test_a_sentence_without_letters_is_written_back_as_it_is():
  """Emoji, times and list numbers are not sent to the model (a model makes words up for
  them: the tiny model answered '🎉' with 'Ein Ein Ein Ein Mann'); they come back in place,
  as format=html's text without letters does (markup.py)."""
  texts = ["🎉", "12:30 - 13:45", "1. Open the door. 2. Close it.", "Wow! 🎉🎉 1. A dog runs."]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["Open the door.", "Close it.", "Wow!", "A dog runs."]
  assert sentences.join(layouts, [s.upper() for s in inputs]) == [
      "🎉", "12:30 - 13:45", "1. OPEN THE DOOR. 2. CLOSE IT.", "WOW! 🎉🎉 1. A DOG RUNS."]
  inputs, layouts = sentences.layout(["3.14\n A line."], "en", 100, len, sentences=False)
  assert inputs == ["A line."] and sentences.join(layouts, ["X"]) == ["3.14\n X"]


def test_urls_addresses_mentions_and_emoji_go_around_the_model_and_back_in_place():
  """A model with none of them in its vocabulary drops them (the tiny Multi30k model's
  '<unk>'): they are no input, and come back as they were where they stood in the
  sentence's translation (a mock model upper-casing, and one saying one more word),
  as format=html's kept pieces do (inline_runs.py). A sentence without them: as before."""
  texts = ["Mail me at anna@example.com 😀", "@anna Two men play. A dog runs.",
           "See https://example.org/a?b=1 or write to @bob@social.example today 🙂!",
           "Write to anna@example.com 😀 today."]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["Mail me at", "Two men play.", "A dog runs.", "See or write to today!",
                    "Write to today."]
  assert sentences.join(layouts, [s.upper() for s in inputs]) == [
      "MAIL ME AT anna@example.com 😀", "@anna TWO MEN PLAY. A DOG RUNS.",
      "SEE https://example.org/a?b=1 OR WRITE TO @bob@social.example TODAY 🙂!",
      "WRITE TO anna@example.com 😀 TODAY."]
  # Words moved: each piece between the words nearest its place, in proportion, in order.
  assert sentences.join(layouts, ["Ja, " + s for s in inputs]) == [
      "Ja, Mail me at anna@example.com 😀", "@anna Ja, Two men play. Ja, A dog runs.",
      "Ja, https://example.org/a?b=1 See or write @bob@social.example to today 🙂!",
      "Ja, Write anna@example.com 😀 to today."]
  assert sentences.join(layouts, inputs) == texts  # The model's words as given: the texts.
  # A word with a character the vocabulary cannot spell (here "ë", "€"): whole, kept.
  texts = ["A dog runs to Zoë for 5 € now.", "Mail zoë@exämple.com today."]
  inputs, layouts = sentences.layout(texts, "en", 100, len, unknown=lambda c: c in "ë€ä")
  assert inputs == ["A dog runs to for 5 now.", "Mail today."]
  assert sentences.join(layouts, [s.upper() for s in inputs]) == [
      "A DOG RUNS TO Zoë FOR 5 € NOW.", "MAIL zoë@exämple.com TODAY."]


def test_a_url_in_parentheses_leaves_them_balanced():
  """"(https://x.org)" took the text's ")" into the URL: the model got "See ( now." (an
  unbalanced bracket it wrote as ", der"), and the URL came back as "https://x.org)"
  glued to it. A URL holds only balanced parentheses (Wikipedia's "Foo_(bar)"), and a
  kept piece alone in brackets goes around the model with them."""
  texts = ["See (https://x.org) now.", "A girl (https://x.org/a_(b)) smiles.",
           "See https://en.wikipedia.org/wiki/Foo_(bar) now.", "(See https://x.org/a).",
           "Write to <anna@example.com> today."]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["See now.", "A girl smiles.", "See now.", "(See).", "Write to today."]
  assert sentences.join(layouts, [s.upper() for s in inputs]) == [
      "SEE (https://x.org) NOW.", "A GIRL (https://x.org/a_(b)) SMILES.",
      "SEE https://en.wikipedia.org/wiki/Foo_(bar) NOW.", "(SEE https://x.org/a).",
      "WRITE TO <anna@example.com> TODAY."]
  # "/" unspellable (the NLLB fixture's): the URL's words are kept pieces too, one
  # starting where it does; the "(" before it stays with it.
  inputs, layouts = sentences.layout(texts[1:2], "en", 100, len, unknown=lambda c: c == "/")
  assert inputs == ["A girl smiles."]
  assert sentences.join(layouts, ["EIN MÄDCHEN LÄCHELT."]) == [
      "EIN MÄDCHEN (https://x.org/a_(b)) LÄCHELT."]


def test_a_url_in_other_brackets_or_quotes_goes_around_the_model_with_them():
  """"<https://x.org>", "[https://x.org]", "{...}": the URL took the closing bracket, so
  the model got "See < now." and the bracket rule never applied; in quotes it got 'See "
  " now.'. A URL holds no "<", ">", "{", "}" and only balanced square brackets (an IPv6
  host's), and quotes go around the model as brackets do."""
  texts = ["See <https://x.org> now.", "See [https://x.org] now.", "See {https://x.org} now.",
           'See "https://x.org" now.', "Er sagt „https://x.org“ oft.",
           "Open http://[::1]:8080/ now."]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["See now."] * 4 + ["Er sagt oft.", "Open now."]
  assert sentences.join(layouts, [s.upper() for s in inputs]) == [
      "SEE <https://x.org> NOW.", "SEE [https://x.org] NOW.", "SEE {https://x.org} NOW.",
      'SEE "https://x.org" NOW.', "ER SAGT „https://x.org“ OFT.", "OPEN http://[::1]:8080/ NOW."]


def test_keycaps_and_subdivision_flags_are_kept_whole():
  """A keycap emoji (a digit, # or *, U+FE0F, U+20E3) and a subdivision flag (U+1F3F4 and
  tag characters) are one emoji each: the model got "Press 1 \u20e3 now." (the keycap cut
  in two around a space) and England's flag without its black flag, for a model that can
  spell every character (unknown=None: NLLB's, one with byte fallback)."""
  england = "\U0001F3F4\U000E0067\U000E0062\U000E0065\U000E006E\U000E0067\U000E007F"
  texts = ["Press 1\uFE0F\u20E3 or #\uFE0F\u20E3 now.", f"We love {england} football."]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["Press or now.", "We love football."]
  assert sentences.join(layouts, [s.upper() for s in inputs]) == [
      "PRESS 1\uFE0F\u20E3 OR #\uFE0F\u20E3 NOW.", f"WE LOVE {england} FOOTBALL."]


def test_two_pieces_placed_at_one_place_are_not_glued():
  """Two kept pieces with words between them, placed together (the model's translation
  shorter than its input: an imported Marian fixture's "Verrrrrierbenenen."): a space
  between them, as between words, not "@bob#summer2024" nor "man’sdoesn’t"."""
  texts = ["Follow @bob and #summer2024 for more pictures of dogs.", "A man’s dog doesn’t run."]
  inputs, layouts = sentences.layout(texts, "en", 100, len, unknown=lambda c: c == "’")
  assert inputs == ["Follow and for more pictures of dogs.", "A dog run."]
  assert sentences.join(layouts, ["Verrrrrierbenenen.", "Hund rennt."]) == [
      "@bob #summer2024 Verrrrrierbenenen.", "Hund man’s doesn’t rennt."]


def test_a_price_with_a_character_the_model_cannot_spell_is_kept_whole():
  """A vocabulary without "$" or "€" (the Marian fixture's): "$12.99" was "$12" kept and
  ".99" given to the model, which dropped it ("Viessbergen $12 siet."). A word's inner
  punctuation is the word's; an emoji within a word is kept alone ("Dogs🐕run": the
  model still gets "Dogs run.")."""
  texts = ["The price is $12.99 at 3:30 pm.", "It costs 1.200,50€ now.", "Dogs🐕run."]
  inputs, layouts = sentences.layout(texts, "en", 100, len, unknown=lambda c: c in "$€🐕")
  assert inputs == ["The price is at 3:30 pm.", "It costs now.", "Dogs run."]
  assert sentences.join(layouts, [s.upper() for s in inputs]) == [
      "THE PRICE IS $12.99 AT 3:30 PM.", "IT COSTS 1.200,50€ NOW.", "DOGS🐕 RUN."]


def test_a_models_own_language_code_splits_by_that_languages_rules():
  """decode.py --split_sentences --source_lang=deu_Latn (an NLLB import's code) or deu
  (OPUS-MT's): German's rules, as 'de' (sentencex knows ISO 639-1 codes; with 'deu_Latn'
  it fell back to rules that end a sentence at '3. Mai')."""
  text = " ".join(NEWS_DE)
  assert sentences.split(text, "deu_Latn") == sentences.split(text, "deu") == sentences.split(
      text, "de")
  assert sentences.split(text, "de")[1::2] == NEWS_DE


def test_an_empty_translation_leaves_no_space_where_a_piece_stood():
  """A model that answers a sentence with nothing (the tiny model does, for some): its
  kept pieces come back alone, with no space of the words it dropped (the space before a
  final emoji was taken for the sentence's own: "A dog 😀" came back " 😀", and "Two men
  play. Mail a@b.org 😀 now." as "Zwei Männer spielen.  a@b.org 😀")."""
  texts = ["A dog 😀", "Two men play. Mail a@b.org 😀 now.", "😀 A dog runs 🙂"]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["A dog", "Two men play.", "Mail now.", "A dog runs"]
  assert sentences.join(layouts, ["", "Zwei Männer spielen.", "", ""]) == [
      "😀", "Zwei Männer spielen. a@b.org 😀", "😀 🙂"]


def test_a_piece_before_punctuation_stays_before_it():
  """An emoji or a mention that ends a clause ("I love it 😀, really") goes before the
  same punctuation in the translation, not after it ("Ich liebe es, 😀 wirklich"); where
  the model wrote none, between the words nearest its place, as before."""
  texts = ["I love it 😀, really.", "Hi @bob, see https://x.org/a now!"]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["I love it, really.", "Hi, see now!"]
  assert sentences.join(layouts, ["Ich liebe es, wirklich.", "Hallo, siehe jetzt!"]) == [
      "Ich liebe es 😀, wirklich.", "Hallo @bob, siehe https://x.org/a jetzt!"]
  assert sentences.join(layouts, ["Ich liebe es wirklich.", "Hallo siehe jetzt!"]) == [
      "Ich liebe es 😀 wirklich.", "Hallo @bob siehe https://x.org/a jetzt!"]
  # The same mark, counted ("One, two 😀,": before the second ","), not the nearest one.
  inputs, layouts = sentences.layout(["One, two 😀, three."], "en", 100, len)
  assert sentences.join(layouts, ["Eins eins eins eins eins eins, zwei, drei."]) == [
      "Eins eins eins eins eins eins, zwei 😀, drei."]


def test_a_piece_between_numbers_stays_between_them():
  """Digits place a piece as letters do: with only a number between two pieces, or after
  one, they went together or to the end ("Numbers @bob @alice 5 here.", "Pay $5, $3. @bob
  @alice"); translated as itself, each text now comes back as it was."""
  texts = ["Numbers @bob 5 @alice here.", "The score was @bob 3-2 @alice today.",
           "Pay @bob $5, @alice $3."]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["Numbers 5 here.", "The score was 3-2 today.", "Pay $5, $3."]
  assert sentences.join(layouts, inputs) == texts
  assert sentences.join(layouts, ["Zahlen 5 hier.", "Es stand 3-2 heute.", "Zahle 5 $, 3 $."]
                        ) == ["Zahlen @bob 5 @alice hier.", "Es stand @bob 3-2 @alice heute.",
                              "Zahle @bob 5 $, @alice 3 $."]


def test_pieces_side_by_side_before_punctuation_stay_before_it():
  """Two kept pieces together before a mark ("@bob 😀!", "@bob (https://y.org).") go before
  it as one does (they went after it: "Ruf an! @bob 😀", "Ich sah. @bob (https://y.org)")."""
  texts = ["Call @bob 😀!", "I saw @bob (https://y.org).", "See https://x.org 😀, then go."]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["Call!", "I saw.", "See, then go."]
  assert sentences.join(layouts, ["Ruf an!", "Ich sah.", "Siehe, dann geh."]) == [
      "Ruf an @bob 😀!", "Ich sah @bob (https://y.org).", "Siehe https://x.org 😀, dann geh."]


def test_pieces_with_only_punctuation_between_them_go_around_the_model_as_one():
  """Kept pieces with only punctuation and spaces between them ("@bob, @bob") are one
  piece, the marks with them: the model got "and park the,." and they came back after
  it ("and park the,. @bob @bob"), their comma lost. Brackets around them all go with
  them; a sentence of pieces and punctuation alone is no input, as before."""
  texts = ["and park the @bob, @bob.", "Thanks @alice, @bob and @carol!",
           "Links: https://a.org, https://b.org.", "Ask (@alice, @carol) now.", "😀, 😀!"]
  inputs, layouts = sentences.layout(texts, "en", 100, len)
  assert inputs == ["and park the.", "Thanks and!", "Links:.", "Ask now."]
  assert sentences.join(layouts, inputs) == texts
  assert sentences.join(layouts, ["und parke den.", "Danke und!", "Links:.", "Frag jetzt."]) == [
      "und parke den @bob, @bob.", "Danke @alice, @bob und @carol!",
      "Links: https://a.org, https://b.org.", "Frag (@alice, @carol) jetzt.", "😀, 😀!"]


def test_pieces_either_side_of_a_sentence_end_are_not_joined_over_it():
  """Kept pieces joined over the punctuation between them (`_together`) are never joined
  over a sentence's end: an HTML text node is split into sentences after its pieces are
  taken out, so "I met @bob. @alice was there." reached the model as one sentence, "I met
  was there." (its "." gone; 0516829), not as "I met." and "was there."."""
  from flax_transformer.serving.markup import Document

  texts = ["I met @bob. @alice was there too.", "Is it @bob? @alice says yes!",
           "Love it 😀! 🎉 Party time."]
  for text in texts:
    document = Document(f"<p>{text}</p>")
    inputs, layouts = sentences.layout(document.texts, "en", 100, len)
    assert len(inputs) == 2, inputs
    assert document.render(sentences.join(layouts, inputs)) == f"<p>{text}</p>"
  document = Document("<p>Contact: a@b.org, c@d.org. Thanks @a, @b and @c!</p>")
  inputs, layouts = sentences.layout(document.texts, "en", 100, len)
  assert inputs == ["Contact:.", "Thanks and!"]  # Within a sentence, still one piece.
  assert document.render(sentences.join(layouts, [s.upper() for s in inputs])) == (
      "<p>CONTACT: a@b.org, c@d.org. THANKS @a, @b AND @c!</p>")
