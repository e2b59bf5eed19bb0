"""The languages side of the LibreTranslate face (libretranslate.py) and of serve.py's own
API: GET /languages, POST /detect, and each request's source and target checked against
the workdir's languages record (flax_transformer.languages), source 'auto' detected
(language_id.py).
"""

from __future__ import annotations

from flax_transformer.languages import Languages, UnknownLanguageError
from flax_transformer.serving.errors import RequestError
from flax_transformer.serving.language_id import Detector

# Names /languages gives the codes of the pairs people train most; others show their code.
NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
         "fi": "Finnish", "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese",
         "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
         "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese"}
AUTO = "auto"


class LanguageApi:
  """What the served model translates between (`languages`) and how a source is found
  (`detector`: None where the model has one source or states none)."""

  def __init__(self, languages: Languages, detector: Detector | None = None):
    self.languages, self.detector = languages, detector

  def known(self) -> str:
    """The pairs, as a LibreTranslate error names them: 'en to de, fr; de to en'."""
    if not self.languages.sources:
      return f"into {', '.join(self.languages.targets)}"
    return "; ".join(f"{s} to {', '.join(self.languages.targets_of(s))}"
                     for s in self.languages.sources)

  def listing(self) -> list[dict]:
    """GET /languages: every language the model knows, each with the targets it
    translates into (none for a target only), as LibreTranslate lists them."""
    codes = dict.fromkeys([*self.languages.sources, *self.languages.targets])
    return [{"code": c, "name": NAMES.get(c, c), "targets": self.languages.targets_of(c)}
            for c in codes]

  def default_pair(self) -> tuple[str, str]:
    """The pair LibreTranslate's page starts with (/frontend/settings)."""
    pairs = self.languages.pairs()
    return pairs[0] if pairs else ("auto", "auto")

  def check(self, source: str, target: str) -> None:
    """A 400 naming the pairs the model knows if it does not translate `source` (or
    'auto') into `target`."""
    if not self.languages.stated:
      raise RequestError(400, "this server's workdir records no language pair: start "
                              "serve.py with --languages=SOURCE,TARGET")
    if target not in self.languages.targets:
      raise RequestError(400, f"{target} is not supported as target: this server translates "
                              f"{self.known()} (GET /languages)")
    if source == AUTO:
      return
    try:
      self.languages.check_pair(source, target)
    except UnknownLanguageError:
      what = "as source" if source not in self.languages.sources else f"into {target}"
      raise RequestError(400, f"{source} is not supported {what}: this server translates "
                              f"{self.known()} (GET /languages)") from None

  def detect(self, text: str) -> list[dict]:
    """POST /detect: the model's sources, most likely first, with confidences 0-100."""
    sources = self.languages.sources
    if len(sources) == 1:
      return [{"confidence": 100.0, "language": sources[0]}]
    if self.detector is None or not self.detector.available:
      raise RequestError(400, "this server cannot detect languages: its model states no "
                              "source languages the language identifier knows")
    return [{"confidence": c, "language": code} for code, c in self.detector.detect(text)]

  def sources_of(self, texts: list[str], source: str, target: str, as_is: bool = False
                 ) -> tuple[list[str | None], list[dict] | None]:
    """Each text's source language, and (source 'auto') what was detected: the best
    source that translates into `target`, per text. `as_is`: a text most likely in
    `target` itself is detected so, its source `target` (`untranslated`: LibreTranslate
    sends it back as it is, argos-translate's identity translation)."""
    if source != AUTO:
      return [source] * len(texts), None
    detected, pairs = [], self.languages.pairs()
    for text in texts:
      ranked = self.detect(text) if self.languages.sources else []
      if not (as_is and ranked and ranked[0]["language"] == target):
        ranked = [d for d in ranked if (d["language"], target) in pairs]
      detected.append(ranked[0] if ranked else {"confidence": 0.0, "language": None})
    if any(d["language"] is None for d in detected):
      raise RequestError(400, f"no source detected that translates into {target}: this "
                              f"server translates {self.known()} (GET /languages)")
    return [d["language"] for d in detected], detected

  def untranslated(self, source: str | None, target: str) -> bool:
    """Whether a text of `source` is sent back as it is into `target`: it is already in
    `target`, and the model does not translate `target` into itself."""
    return source == target and (source, target) not in self.languages.pairs()

  def directions(self, texts: list[str], source: str | None, target: str | None
                 ) -> list[tuple[str | None, str | None]]:
    """serve.py's own API: each text's (source, target) for the batcher; a pair the model
    does not know is a 400 naming those it does (one line)."""
    if source == AUTO and target is not None:
      self.check(AUTO, target)
      return [(s, target) for s in self.sources_of(texts, AUTO, target)[0]]
    try:
      pair = self.languages.check_pair(source, target)
    except UnknownLanguageError as e:
      raise RequestError(400, str(e)) from None
    return [pair] * len(texts)


def for_model(languages: Languages | tuple[str, str]) -> LanguageApi:
  """The API of a model's languages (a pair: serve.py --languages), with a detector where
  it has several sources."""
  if isinstance(languages, tuple):
    languages = Languages.one_pair(*languages)
  many = len(languages.sources) > 1
  return LanguageApi(languages, Detector(languages.sources) if many else None)
