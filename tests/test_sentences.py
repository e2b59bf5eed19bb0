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
