"""Language identification for source=auto and POST /detect: py3langid's model (inside its
package; chosen by bench/language_id.py, BENCHMARKS.md), restricted to the languages the
served model translates from.

`Detector(codes).detect(text)` -> [(code, confidence 0-100), ...], best first, over `codes`
(the model's sources): LibreTranslate's /detect answer. A model with one source needs no
library (its one source, confidence 100); codes the library does not know are left out
(a model none of whose sources it knows has no detection: `available` is False).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from flax_transformer.errors import ConfigError

INSTALL = "pip install 'flax-transformer[serve]' (or: pip install py3langid)"


class Detector:
  """Guesses which of `codes` a text is in."""

  def __init__(self, codes: Sequence[str]):
    self.codes = tuple(codes)
    self._model = None
    if len(self.codes) < 2:
      return
    try:
      from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
      raise ConfigError(f"detecting the source (source=auto, /detect) of a model with "
                        f"{len(self.codes)} sources needs py3langid: {INSTALL}") from None
    model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    known = [code for code in self.codes if code in model.nb_classes]
    if len(known) < len(self.codes):
      logging.warning("Language identification knows %s of the model's sources %s: "
                      "the others are never detected", known, list(self.codes))
    if len(known) >= 2:
      model.set_languages(known)
      self._model = model
    self.codes = tuple(known) if len(known) >= 2 else self.codes

  @property
  def available(self) -> bool:
    return len(self.codes) == 1 or self._model is not None

  def detect(self, text: str) -> list[tuple[str, float]]:
    """The model's sources, most likely first, with confidences 0-100."""
    if len(self.codes) == 1:
      return [(self.codes[0], 100.0)]
    if self._model is None:
      return []
    return [(code, round(100 * float(p), 2)) for code, p in self._model.rank(text)]

  def best(self, text: str) -> tuple[str, float] | None:
    ranked = self.detect(text)
    return ranked[0] if ranked else None
