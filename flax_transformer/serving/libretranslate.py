"""LibreTranslate's API on serve.py, for the clients that speak it (libretranslatepy, browser
extensions, office plug-ins, apps with a "LibreTranslate URL" setting).

POST /translate with `q` (a string or a list of strings), `source` (or "auto": each text's
detected, among the model's sources), `target`, `format` ("text" or "html": markup.py),
`alternatives` (N others per text, from the n-best search) and `api_key` (serve.py's
token), as JSON, a form (urlencoded or multipart) or the query string ->
{"translatedText": a string or a list}; GET /languages -> the workdir's languages, each
with its targets; POST /detect -> q's language among the sources (language_api.py); GET
/frontend/settings -> LibreTranslate's settings from serve.py's limits. Each text is
split into sentences (sentences.py), searched in the batcher's batches with every other
request's, and joined back with its own whitespace. A body with `text` instead of `q` is
serve.py's own /translate (app.py). Errors: {"error": one line}, with
LibreTranslate's status codes (400 a bad request or an unsupported language or option,
403 a bad api_key). Any origin may call these routes (CORS), as
LibreTranslate's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.parse

from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request

from flax_transformer.serving import auth, markup
from flax_transformer.serving.language_api import AUTO, NAMES, LanguageApi
from flax_transformer.serving.errors import RequestError
from flax_transformer.translation import sentences

FIELDS = {"q", "source", "target"}  # Any of them, and no `text`: a LibreTranslate request.
ROUTES = ("/translate", "/languages", "/detect", "/frontend/settings")
FRONTEND_TIMEOUT_MS = 500  # LibreTranslate's default (its web page's typing pause).


class Cors:
  """ASGI middleware: LibreTranslate's routes answer any origin, preflights included, as
  LibreTranslate's (flask-cors' defaults), so web pages and browser extensions can call
  them; the others (/score, /health, the page) stay same-origin."""

  def __init__(self, app):
    self.app = app
    self.cors = CORSMiddleware(app, allow_origins=["*"], allow_methods=["GET", "POST"],
                               allow_headers=["*"])

  async def __call__(self, scope, receive, send):
    chosen = self.cors if scope["type"] == "http" and scope["path"] in ROUTES else self.app
    await chosen(scope, receive, send)


async def fields_of(request: Request, body: bytes) -> dict | None:
  """A LibreTranslate request's fields (`q`, `source` or `target` and no `text`), or
  None for any other (serve.py's own /translate reads it). As LibreTranslate: a JSON
  body's, or else the form's (urlencoded or multipart) and the query string's, the
  query's first. A JSON body is told by parsing it, not by its Content-Type: curl -d
  and urllib send JSON as a form."""
  if request.headers.get("content-type", "").startswith("multipart/form-data"):
    data = _first([*request.query_params.multi_items(), *await _multipart(request, body)])
  else:
    try:
      data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
      try:
        form = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True)
      except (UnicodeDecodeError, ValueError):
        return None
      data = _first([*request.query_params.multi_items(), *form])
  ours = not isinstance(data, dict) or "text" in data or not FIELDS & data.keys()
  return None if ours else data


def _first(pairs: list[tuple[str, str]]) -> dict:
  """Each key's first value, as LibreTranslate's request.values.get gives it (the query's
  fields before the form's)."""
  fields: dict = {}
  for key, value in pairs:
    fields.setdefault(key, value)
  return fields


async def _multipart(request: Request, body: bytes) -> list[tuple[str, str]]:
  """A multipart form's text fields (files left out), parsed by Starlette (python-multipart)
  from `body`, already read within the server's limits."""
  async def replay():
    return {"type": "http.request", "body": body, "more_body": False}

  form = await Request(request.scope, replay).form()
  return [(key, value) for key, value in form.multi_items() if isinstance(value, str)]


class LibreTranslate:
  """The face: `languages` (language_api.LanguageApi: the workdir's languages, or serve.py
  --languages' pair, and the source detector); `batcher` searches (its default search, its
  token limit); `limits` (app.Limits): texts per request (max_sentences), characters per
  text (max_chars), the widest beam (max_beam: alternatives + 1 at most)."""

  def __init__(self, languages: LanguageApi, token: str | None, batcher, limits):
    self.api, self.token = languages, token
    self._batcher, self._limits = batcher, limits
    self._unknown = sentences.Unknown(batcher.tokenizer.source)  # Words kept from it.

  def languages(self) -> list[dict]:
    return self.api.listing()

  def settings(self) -> dict:
    """GET /frontend/settings: LibreTranslate's keys, from this server's limits."""
    source, target = self.api.default_pair()
    return {"charLimit": self._limits.max_chars, "frontendTimeout": FRONTEND_TIMEOUT_MS,
            "apiKeys": self.token is not None, "keyRequired": self.token is not None,
            "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
            "language": {"source": {"code": source, "name": NAMES.get(source, source)},
                         "target": {"code": target, "name": NAMES.get(target, target)}}}

  def check_key(self, key) -> None:
    auth.check(self.token, key, 403, "missing api_key: this server needs its token as api_key",
               "Invalid API key")

  def check_query_key(self, request: Request) -> bool:
    """Checks an api_key in the query string, before the body is read: whether one was."""
    key = request.query_params.get("api_key")
    if key is not None:
      self.check_key(key)
    return key is not None

  def detect(self, fields: dict, key_checked: bool) -> list[dict]:
    """POST /detect: q's language among the model's sources; for a list of texts, one
    ranking of them all (LanguageApi.detect), as LibreTranslate's."""
    if not key_checked:
      self.check_key(fields.get("api_key"))
    q = fields.get("q")
    if not q:  # None, "", [], as LibreTranslate.
      raise RequestError(400, "Invalid request: missing q parameter")
    texts = self._texts(q)
    self._check_texts(texts)
    return self.api.detect(texts)

  @staticmethod
  def _texts(q) -> list[str]:
    """q's texts: q itself, or its items (each a string, or a 400 naming it)."""
    texts = [q] if isinstance(q, str) else q
    if not isinstance(texts, list):
      raise RequestError(400, "Invalid request: q must be a string or a list of strings")
    for i, text in enumerate(texts):
      if not isinstance(text, str):  # Named as the q item it is (Weblate sends lists).
        raise RequestError(400, f"Invalid request: q[{i}] is not a string: q must be a "
                                f"string or a list of strings")
    return texts

  def _check_languages(self, source, target) -> tuple[str, str]:
    """(source, target) as the model writes them, checked."""
    for field, value in (("source", source), ("target", target)):
      if not isinstance(value, str) or not value:
        raise RequestError(400, f"Invalid request: missing {field} parameter")
      if not value.isprintable() or len(value) > 32:  # Echoed below: no lone surrogate.
        raise RequestError(400, f"Invalid request: {field} is not a language code")
    source, target = self.api.model_code(source), self.api.model_code(target)
    # A language into itself: its texts as they are (untranslated), as LibreTranslate's
    # (argos-translate's identity translation), for any language the model knows; so
    # 'auto' into a source the model translates from only: the texts detected in it as
    # they are, any other a 400 (LanguageApi.sources_of).
    into_itself = source == AUTO and target in self.api.languages.sources
    if not (into_itself or self.api.untranslated(source, target) and self.api.knows(source)):
      self.api.check(source, target)
    return source, target

  def _alternatives(self, value) -> int:
    """LibreTranslate's `alternatives`: a number (of any JSON type int() takes), below 0
    taken as 0, at most the widest beam less the best."""
    try:
      count = max(0, int(value or 0))
    except (TypeError, ValueError):
      raise RequestError(400, "Invalid request: alternatives parameter is not a number"
                         ) from None
    if count + 1 > self._limits.max_beam:
      raise RequestError(400, "Invalid request: alternatives parameter must be <= "
                              f"{self._limits.max_beam - 1} (--max_beam less the best)")
    return count

  def _check_texts(self, texts: list[str]) -> None:
    """How many texts, each valid text (errors name the q item), all within the character
    limit together."""
    if len(texts) > self._limits.max_sentences:
      raise RequestError(400, f"Invalid request: q has {len(texts)} texts, over "
                              f"{self._limits.max_sentences} (--max_sentences)")
    for i, text in enumerate(texts):
      try:  # JSON admits lone surrogates ("\\ud800"); the tokenizer does not.
        text.encode("utf-8")
      except UnicodeEncodeError as e:
        raise RequestError(400, f"Invalid request: q[{i}] is not valid text: {e.reason} at "
                                f"character {e.start}") from None
    # LibreTranslate's --char-limit counts the request: all of q's texts together.
    chars = sum(len(text) for text in texts)
    if chars > self._limits.max_chars >= 0:  # LibreTranslate's line, then the flag.
      raise RequestError(400, f"Invalid request: request ({chars}) exceeds text limit "
                              f"({self._limits.max_chars}): q's texts together (--max_chars)")

  def _search(self, alternatives: int):
    default = self._batcher.default_search
    if not alternatives:
      return default
    return dataclasses.replace(default, beam_size=max(default.beam_size, alternatives + 1),
                               nbest=alternatives + 1)

  async def translate(self, fields: dict, key_checked: bool) -> dict:
    """`key_checked`: the token was presented outside the body, and checked."""
    if not key_checked:
      self.check_key(fields.get("api_key"))
    q = fields.get("q")
    if not q:  # None, "", [], as LibreTranslate.
      raise RequestError(400, "Invalid request: missing q parameter")
    texts = self._texts(q)
    source, target = self._check_languages(fields.get("source"), fields.get("target"))
    alternatives = self._alternatives(fields.get("alternatives"))
    text_format = fields.get("format") or "text"  # LibreTranslate's: empty or null is text.
    if text_format not in ("text", "html"):
      text_format = ascii(text_format)[:40]  # Echoed: valid text whatever was sent.
      raise RequestError(400, f"{text_format} format is not supported (formats: text, html)")
    self._check_texts(texts)
    # An HTML text's language is its text's: markup (class="u-url mention", href=...)
    # would pass for English.
    probes = ([markup.Document(text).prose for text in texts]
              if text_format == "html" and source == AUTO else texts)
    sources, detected = self.api.sources_of(probes, source, target, as_is=True)
    translations, others = await self._translated(texts, sources, target, alternatives,
                                                  text_format)
    one = isinstance(q, str)
    answer = {"translatedText": translations[0] if one else translations}
    if detected is not None:
      answer["detectedLanguage"] = detected[0] if one else detected
    if alternatives:
      answer["alternatives"] = others[0] if one else others
    return answer

  async def _translated(self, texts: list[str], sources: list, target: str,
                        alternatives: int, text_format: str
                        ) -> tuple[list[str], list[list[str]]]:
    """Each text's translation from its source, and its alternatives; a text detected in
    `target` itself as it is, with none (language_api.untranslated)."""
    chosen = [i for i, source in enumerate(sources) if not self.api.untranslated(source, target)]
    directions = [(sources[i], target) for i in chosen]
    if text_format == "html":  # No alternatives, as LibreTranslate.
      found = await self._html([texts[i] for i in chosen], directions), [[] for _ in chosen]
    else:
      found = await self._text([texts[i] for i in chosen], alternatives, directions)
    translations, others = list(texts), [[] for _ in texts]
    for i, translation, other in zip(chosen, *found):
      translations[i], others[i] = translation, other
    return translations, others

  async def _found(self, texts: list[str], directions: list, alternatives: int = 0):
    """Each text's sentences (split as its source language's) searched in the batcher's
    batches, each in its text's direction: (layouts, n-best lists)."""
    batcher = self._batcher
    inputs, layouts, rows = [], [], []
    for text, direction in zip(texts, directions):
      language = self.api.shown(direction[0]) or "en"  # sentencex's codes are ISO's.
      found, (layout,) = sentences.layout([text], language, batcher.max_tokens,
                                          batcher.source_length, unknown=self._unknown)
      inputs += found
      layouts.append(layout)
      rows += [direction] * len(found)
    search = self._search(alternatives)
    found = (await asyncio.wrap_future(batcher.translate(inputs, search, directions=rows))
             if inputs else [])
    return layouts, found

  async def _text(self, texts: list[str], alternatives: int, directions: list
                  ) -> tuple[list[str], list[list[str]]]:
    """Translations, and up to `alternatives` others per text. As LibreTranslate's
    (argos-translate's hypotheses): the k-th alternative of a split text joins its
    sentences' k-th hypotheses; duplicates and the translation itself left out."""
    layouts, found = await self._found(texts, directions, alternatives)
    ranked = [sentences.join(layouts, [hyps[min(k, len(hyps) - 1)][0] for hyps in found])
              for k in range(alternatives + 1)]
    others = []
    for i, best in enumerate(ranked[0]):
      seen, unique = {best, ""}, []
      for other in (ranked[k][i] for k in range(1, alternatives + 1)):
        if other not in seen:
          seen.add(other)
          unique.append(other)
      others.append(unique)
    return ranked[0], others

  async def _html(self, texts: list[str], directions: list) -> list[str]:
    """Each document's text nodes translated (their sentences split), its markup kept."""
    documents = [markup.Document(text) for text in texts]
    layouts, found = await self._found(
        [node for d in documents for node in d.texts],
        [direction for d, direction in zip(documents, directions) for _ in d.texts])
    nodes = iter(sentences.join(layouts, [hyps[0][0] for hyps in found]))
    return [d.render([next(nodes) for _ in d.texts]) for d in documents]
