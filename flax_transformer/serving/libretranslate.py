"""LibreTranslate's API on serve.py, for the clients that speak it (libretranslatepy, browser
extensions, office plug-ins, apps with a "LibreTranslate URL" setting).

POST /translate with `q` (a string or a list of strings), `source` (or "auto"), `target`,
`format` ("text"; "html" is refused) and `api_key` (serve.py's token), as a form or as
JSON -> {"translatedText": a string or a list}; GET /languages -> the workdir's pair. A
body with `text` instead of `q` is serve.py's own /translate (app.py). Both go through
the one batcher, with the server's default search. Errors: {"error": one line}, with
LibreTranslate's status codes (400 a bad request or an unsupported language, 403 a bad
api_key).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import urllib.parse

from starlette.requests import Request

from flax_transformer.serving.errors import RequestError

# Names /languages gives the codes of the pairs people train most; others show their code.
NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
         "fi": "Finnish", "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese",
         "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
         "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese"}
FIELDS = {"q", "source", "target"}  # Any of them, and no `text`: a LibreTranslate request.


def fields_of(body: bytes) -> dict | None:
  """A LibreTranslate request's fields (a JSON object or a form with `q`, `source` or
  `target` and no `text`), or None for any other body (serve.py's own /translate reads
  it). Told apart by the body, not its Content-Type: curl -d and urllib send JSON as a
  form too."""
  try:
    data = json.loads(body)
  except (ValueError, UnicodeDecodeError, RecursionError):
    try:
      data = {key: values[-1] for key, values in
              urllib.parse.parse_qs(body.decode("utf-8"), keep_blank_values=True).items()}
    except (UnicodeDecodeError, ValueError):
      return None
  ours = not isinstance(data, dict) or "text" in data or not FIELDS & data.keys()
  return None if ours else data


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

  def _check_key(self, request: Request, fields: dict) -> None:
    if self.token is None:
      return
    key = fields.get("api_key")
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if not key and scheme.lower() == "bearer":
      key = value.strip()
    if not isinstance(key, str) or not key:
      raise RequestError(403, "missing api_key: this server needs its token as api_key")
    if not hmac.compare_digest(key.encode(), self.token.encode()):
      raise RequestError(403, "Invalid API key")

  def _check_languages(self, source, target) -> None:
    for field, value in (("source", source), ("target", target)):
      if not isinstance(value, str) or not value:
        raise RequestError(400, f"Invalid request: missing {field} parameter")
    if self.pair is None:
      raise RequestError(400, "this server's workdir records no language pair: start "
                              "serve.py with --languages=SOURCE,TARGET")
    if source not in (self.pair[0], "auto"):
      raise RequestError(400, f"{source} is not supported as source: this server translates "
                              f"{self.pair[0]} to {self.pair[1]} (GET /languages)")
    if target != self.pair[1]:
      raise RequestError(400, f"{target} is not supported as target: this server translates "
                              f"{self.pair[0]} to {self.pair[1]} (GET /languages)")

  async def translate(self, request: Request, fields: dict) -> dict:
    self._check_key(request, fields)
    q = fields.get("q")
    if q is None or q == "":
      raise RequestError(400, "Invalid request: missing q parameter")
    sentences = [q] if isinstance(q, str) else q
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
      raise RequestError(400, "Invalid request: q must be a string or a list of strings")
    self._check_languages(fields.get("source"), fields.get("target"))
    text_format = fields.get("format", "text")
    if text_format != "text":
      raise RequestError(400, f"format {text_format!r} is not supported: send format 'text' "
                              "(plain text; this server does not translate HTML)")
    try:
      self._check_sentences("q", sentences)
    except RequestError as e:  # LibreTranslate answers every bad request 400.
      raise RequestError(400, str(e)) from None
    found = await asyncio.wrap_future(self._translate(sentences))
    translations = [hyps[0][0] for hyps in found]
    return {"translatedText": translations[0] if isinstance(q, str) else translations}
