"""The languages side of the LibreTranslate face (libretranslate.py) and of serve.py's own
API: GET /languages, POST /detect, and each request's source and target checked against
the workdir's languages record (flax_transformer.languages), source 'auto' detected
(language_id.py).
"""

from __future__ import annotations

from flax_transformer import language_codes
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
  (`detector`, over the codes clients use: None where the model has one source or
  states none). Clients see and send ISO 639 codes ('de', 'zh-Hant'), as LibreTranslate's
  and Mastodon's are; the model's own ('deu', 'deu_Latn') are taken too
  (language_codes.py). Within, codes are the model's."""

  def __init__(self, languages: Languages, detector: Detector | None = None):
    self.languages, self.detector = languages, detector
    self._codes = list(dict.fromkeys([*languages.sources, *languages.targets]))
    listed = language_codes.listed(self._codes) if languages.stated else []
    self._shown = {model: shown for shown, model in listed}
    self._table = {shown: model for shown, model in listed}

  def model_code(self, code: str) -> str:
    """A client's code as the model writes it ('de' -> 'deu_Latn'); as sent if the model
    knows no such language (or it is 'auto')."""
    if code == AUTO or not self._table or not isinstance(code, str):
      return code
    return language_codes.resolve(code, self._codes, self._table) or code

  def shown(self, code: str | None) -> str | None:
    """A model's code as clients see it ('deu_Latn' -> 'de')."""
    return self._shown.get(code, code)

  def known(self) -> str:
    """The pairs, as a LibreTranslate error names them: 'en to de, fr; de to en'."""
    if not self.languages.sources:
      return f"into {', '.join(map(self.shown, self.languages.targets))}"
    if self.languages.every_pair:  # NLLB's 202: one list, not 202 x 201 pairs.
      return f"between any two of {', '.join(map(self.shown, self.languages.targets))}"
    return "; ".join(f"{self.shown(s)} to "
                     f"{', '.join(map(self.shown, self.languages.targets_of(s)))}"
                     for s in self.languages.sources)

  def listing(self) -> list[dict]:
    """GET /languages: every language the model knows, each with the targets it
    translates into (none for a target only), as LibreTranslate lists them."""
    shown = {self.shown(c) for c in self._codes}
    return [{"code": self.shown(c), "name": self._name(self.shown(c), shown),
             "targets": [self.shown(t) for t in self.languages.targets_of(c)]}
            for c in self._codes]

  @staticmethod
  def _name(code: str, shown: set[str]) -> str:
    """A listed code's name; Chinese says its script where the model has both (NLLB's
    zho_Hans 'zh' and zho_Hant 'zh-Hant'), as LibreTranslate names them."""
    if code == "zh-Hant":
      return "Chinese (Traditional)"
    if code == "zh" and "zh-Hant" in shown:
      return "Chinese (Simplified)"
    return NAMES.get(code, code)

  def default_pair(self) -> tuple[str, str]:
    """The pair LibreTranslate's page starts with (/frontend/settings)."""
    pairs = self.languages.pairs()
    return (self.shown(pairs[0][0]), self.shown(pairs[0][1])) if pairs else ("auto", "auto")

  def check(self, source: str, target: str) -> None:
    """A 400 naming the pairs the model knows if it does not translate `source` (or
    'auto') into `target` (the model's codes: `model_code`)."""
    if not self.languages.stated:
      raise RequestError(400, "this server's workdir records no language pair: start "
                              "serve.py with --languages=SOURCE,TARGET")
    if target not in self.languages.targets:
      raise RequestError(400, f"{self.shown(target)} is not supported as target: this "
                              f"server translates "
                              f"{self.known()} (GET /languages)")
    if source == AUTO:
      return
    try:
      self.languages.check_pair(source, target)
    except UnknownLanguageError:
      what = ("as source" if source not in self.languages.sources
              else f"into {self.shown(target)}")
      raise RequestError(400, f"{self.shown(source)} is not supported {what}: this server "
                              f"translates "
                              f"{self.known()} (GET /languages)") from None

  def knows(self, code: str) -> bool:
    """Whether `code` (the model's) is one of the model's languages, source or target."""
    return code in self._codes

  def detect(self, texts: list[str]) -> list[dict]:
    """POST /detect: the model's sources, most likely first, with confidences 0-100. For
    several texts, one list, as LibreTranslate's (language.py's detect_languages): each
    language's confidence averaged over the texts, ranked by that average times the
    length of those texts. A text with no letter (empty, emoji, digits) has no language
    and counts for none; if every text is such, every source at confidence 0
    (LibreTranslate's answer when nothing is detected)."""
    texts = [text for text in texts if _has_letters(text)]
    if not texts:  # The sources a text could be detected in (or the 400 saying none).
      codes = {code for code, _ in self._ranked("")}
      return [{"confidence": 0.0, "language": self.shown(code)}
              for code in self.languages.sources if code in codes]
    found: dict[str, list[tuple[float, int]]] = {}
    for text in texts:
      for code, confidence in self._ranked(text):
        found.setdefault(code, []).append((confidence, len(text)))
    merged = [(code, sum(c for c, _ in pairs) / len(pairs), sum(n for _, n in pairs))
              for code, pairs in found.items()]
    merged.sort(key=lambda item: item[1] * item[2], reverse=True)
    return [{"confidence": round(c, 2), "language": self.shown(code)} for code, c, _ in merged]

  def _ranked(self, text: str) -> list[tuple[str, float]]:
    """(source, confidence 0-100) for each of the model's sources (its codes), most
    likely first."""
    sources = self.languages.sources
    if len(sources) == 1:
      return [(sources[0], 100.0)]
    if self.detector is None or not self.detector.available:
      raise RequestError(400, "this server cannot detect languages: its model states no "
                              "source languages the language identifier knows")
    return [(self.model_code(code), c) for code, c in self.detector.detect(text)]

  def sources_of(self, texts: list[str], source: str, target: str, as_is: bool = False
                 ) -> tuple[list[str | None], list[dict] | None]:
    """Each text's source language, and (source 'auto') what was detected: the best
    source that translates into `target`, per text. `as_is`: a text most likely in
    `target` itself is detected so, its source `target` (`untranslated`: LibreTranslate
    sends it back as it is, argos-translate's identity translation)."""
    if source != AUTO:
      return [source] * len(texts), None
    found, pairs = [], self.languages.pairs()
    for text in texts:
      ranked = self._ranked(text) if self.languages.sources else []
      if ranked and not _has_letters(text):  # No language: no guess, confidence 0 (detect).
        ranked = [(code, 0.0) for code in self.languages.sources if code in dict(ranked)]
      if not (as_is and ranked and ranked[0][0] == target):
        ranked = [(code, c) for code, c in ranked if (code, target) in pairs]
      found.append(ranked[0] if ranked else None)
    if None in found:
      raise RequestError(400, f"no source detected that translates into {self.shown(target)}"
                              f": this server translates {self.known()} (GET /languages)")
    return ([code for code, _ in found],
            [{"confidence": c, "language": self.shown(code)} for code, c in found])

  def untranslated(self, source: str | None, target: str) -> bool:
    """Whether a text of `source` is sent back as it is into `target`: it is already in
    `target`, and the model does not translate `target` into itself."""
    return source == target and (source, target) not in self.languages.pairs()

  def directions(self, texts: list[str], source: str | None, target: str | None
                 ) -> list[tuple[str | None, str | None]]:
    """serve.py's own API: each text's (source, target) for the batcher; a pair the model
    does not know is a 400 naming those it does (one line). Codes in either form
    (Languages.check_pair resolves them)."""
    if source == AUTO and target is not None:
      target = self.languages.model_code(target, self.languages.targets)
      self.check(AUTO, target)
      return [(s, target) for s in self.sources_of(texts, AUTO, target)[0]]
    try:
      pair = self.languages.check_pair(source, target)
    except UnknownLanguageError as e:
      raise RequestError(400, str(e)) from None
    return [pair] * len(texts)


def _has_letters(text: str) -> bool:
  """Whether `text` has a language to detect (not empty, emoji or digits only)."""
  return any(c.isalpha() for c in text)


def for_model(languages: Languages | tuple[str, str]) -> LanguageApi:
  """The API of a model's languages (a pair: serve.py --languages), with a detector where
  it has several sources."""
  if isinstance(languages, tuple):
    languages = Languages.one_pair(*languages)
  api = LanguageApi(languages)
  if len(languages.sources) > 1:  # Over the codes the identifier knows: 'de', not 'deu'.
    api.detector = Detector([api.shown(code) for code in languages.sources])
  return api
