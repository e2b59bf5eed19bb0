"""A hypothesis of a model trained on several directions, as written (directions.py): its
forced target token cut, and a target token the model writes again dropped, as
transformers' skip_special_tokens drops NLLB's language codes."""

import re

import numpy as np
import pytest

from flax_transformer.data.tokenizer import EOS_ID, train_tokenizer
from flax_transformer.errors import DataError
from flax_transformer.languages import Languages
from flax_transformer.translation.directions import Directions

CAPTIONS = ["A dog runs in the park.", "Un chien court dans le parc.",
            "Ein Hund rennt im Park.", "Two men are talking.", "Deux hommes parlent.",
            "Zwei Männer unterhalten sich."] * 20


def test_a_target_token_the_model_writes_again_is_not_in_the_translation(tmp_path):
  """A weakly trained model (80 steps of configs/multi30k_multilingual.py's directions)
  wrote '<2fr> Un Un ...' after its forced '<2fr>': the text is 'Un Un ...'."""
  languages = Languages.trained(["en", "de", "fr"])
  tokenizer = train_tokenizer(CAPTIONS, tmp_path / "vocab.model", vocab_size=80,
                              user_defined_symbols=list(languages.target_tokens.values()))
  directions = Directions(languages, tokenizer)
  rows = directions.resolve(1, "en", "fr")
  forced = directions.forced(rows, None)[0]
  text = tokenizer.tokenize("Un chien court.")[:-1]
  again = tokenizer.tokenize("<2fr> Un chien <2de> court.")[:-1]
  assert tokenizer.detokenize(np.concatenate([forced, again])) == (
      "<2fr> <2fr> Un chien <2de> court.")  # The pieces are whole, as the model sees them.
  for hypothesis in (np.concatenate([forced, text, [EOS_ID]]),
                     np.concatenate([forced, again, [EOS_ID]])):
    assert tokenizer.detokenize(directions.written(hypothesis, "fr")) == "Un chien court."


def test_a_target_token_that_is_not_one_piece_is_refused(tmp_path):
  """A target token the target side splits into pieces ('<2en>' without it as a
  user-defined symbol) would have its last piece taken for the token and cut from every
  output: Directions refuses it in one line naming the token and its pieces."""
  languages = Languages.trained(["en", "de", "fr"])
  tokenizer = train_tokenizer(CAPTIONS, tmp_path / "vocab.model", vocab_size=80)
  pieces = ", ".join(map(repr, tokenizer.pieces(tokenizer.tokenize("<2en>")[:-1])))
  assert pieces.count(",") >= 1  # Split, as the message says.
  with pytest.raises(DataError, match=re.escape(
      "run.json: the languages record's target token '<2en>' (en) is not one piece of the "
      f"target vocabulary: it tokenizes to {pieces}")):
    Directions(languages, tokenizer)
