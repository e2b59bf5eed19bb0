"""LibreTranslate's API on serve.py, for the clients that speak it (libretranslatepy, browser
extensions, office plug-ins, apps with a "LibreTranslate URL" setting).

POST /translate with `q` (a string or a list of strings), `source` (or "auto": no
detection, the pair's source is taken), `target`, `format` ("text"; "html" is refused)
and `api_key` (serve.py's token), as JSON, a form (urlencoded or multipart) or the query
string -> {"translatedText": a string or a list}; GET /languages -> the workdir's pair.
A body with `text` instead of `q` is serve.py's own /translate (app.py). Both go through
the one batcher, with the server's default search. Errors: {"error": one line}, with
LibreTranslate's status codes (400 a bad request or an unsupported language or option,
403 a bad api_key, 404 /detect). Any origin may call these routes (CORS), as
LibreTranslate's.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse

from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request

from flax_transformer.serving import auth
from flax_transformer.serving.errors import RequestError

# Names /languages gives the codes of the pairs people train most; others show their code.
NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
         "fi": "Finnish", "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese",
         "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
         "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese"}
FIELDS = {"q", "source", "target"}  # Any of them, and no `text`: a LibreTranslate request.
ROUTES = ("/translate", "/languages", "/detect")


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
  """The face: `pair` (source, target) or None (serve.py --languages not given and the
  workdir records none); `translate(sentences)` -> a Future of their n-best lists, as
  `Batcher.translate`'s; `check_sentences`: serve.py's check of their count and length."""

  def __init__(self, pair: tuple[str, str] | None, token: str | None, check_sentences,
               translate):
    self.pair, self.token = pair, token
    self._check_sentences, self._translate = check_sentences, translate

  def languages(self) -> list[dict]:
    if self.pair is None:
      return []
    source, target = self.pair
    return [{"code": source, "name": NAMES.get(source, source), "targets": [target]},
            {"code": target, "name": NAMES.get(target, target), "targets": []}]

  def check_key(self, key) -> None:
    auth.check(self.token, key, 403, "missing api_key: this server needs its token as api_key",
               "Invalid API key")

  def check_query_key(self, request: Request) -> bool:
    """Checks an api_key in the query string, before the body is read: whether one was."""
    key = request.query_params.get("api_key")
    if key is not None:
      self.check_key(key)
    return key is not None

  def detect(self):
    pair = "" if self.pair is None else f": it translates {self.pair[0]} to {self.pair[1]}"
    raise RequestError(404, f"this server does not detect languages{pair} (send source "
                            "'auto' to /translate to take its source language)")

  def _check_languages(self, source, target) -> None:
    for field, value in (("source", source), ("target", target)):
      if not isinstance(value, str) or not value:
        raise RequestError(400, f"Invalid request: missing {field} parameter")
      if not value.isprintable() or len(value) > 32:  # Echoed below: no lone surrogate.
        raise RequestError(400, f"Invalid request: {field} is not a language code")
    if self.pair is None:
      raise RequestError(400, "this server's workdir records no language pair: start "
                              "serve.py with --languages=SOURCE,TARGET")
    if source not in (self.pair[0], "auto"):
      raise RequestError(400, f"{source} is not supported as source: this server translates "
                              f"{self.pair[0]} to {self.pair[1]} (GET /languages)")
    if target != self.pair[1]:
      raise RequestError(400, f"{target} is not supported as target: this server translates "
                              f"{self.pair[0]} to {self.pair[1]} (GET /languages)")

  async def translate(self, fields: dict, key_checked: bool) -> dict:
    """`key_checked`: the token was presented outside the body, and checked."""
    if not key_checked:
      self.check_key(fields.get("api_key"))
    q = fields.get("q")
    if not q:  # None, "", [], as LibreTranslate.
      raise RequestError(400, "Invalid request: missing q parameter")
    texts = [q] if isinstance(q, str) else q
    if not isinstance(texts, list) or not all(isinstance(s, str) for s in texts):
      raise RequestError(400, "Invalid request: q must be a string or a list of strings")
    # One model input per line (clients send paragraphs a line each), the newlines and
    # blank lines kept: [line, newline, line, ...] per text.
    parts = [re.split(r"(\r?\n)", text) for text in texts]
    sentences = [line for text in parts for line in text[::2] if line.strip()]
    self._check_languages(fields.get("source"), fields.get("target"))
    if fields.get("alternatives") not in (None, 0, "", "0"):
      raise RequestError(400, "alternatives is not supported: this server gives one "
                              "translation per text")
    text_format = fields.get("format") or "text"  # LibreTranslate's: empty or null is text.
    if text_format != "text":
      text_format = ascii(text_format)[:40]  # Echoed: valid text whatever was sent.
      raise RequestError(400, f"format {text_format} is not supported: send format 'text' "
                              "(plain text; this server does not translate HTML)")
    try:
      self._check_sentences("q", sentences)
    except RequestError as e:  # LibreTranslate answers every bad request 400.
      raise RequestError(400, str(e)) from None
    found = await asyncio.wrap_future(self._translate(sentences)) if sentences else []
    lines = iter(hyps[0][0] for hyps in found)
    translations = ["".join(next(lines) if i % 2 == 0 and part.strip() else part
                            for i, part in enumerate(text)) for text in parts]
    answer = {"translatedText": translations[0] if isinstance(q, str) else translations}
    if fields["source"] == "auto":  # Not detected: the pair's one source (docs/decoding.md).
      detected = {"confidence": 100, "language": self.pair[0]}
      answer["detectedLanguage"] = detected if isinstance(q, str) else [detected] * len(q)
    return answer
