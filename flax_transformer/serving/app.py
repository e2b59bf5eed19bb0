"""The HTTP API (FastAPI): /translate, /score, /health, the page at /, and LibreTranslate's
/translate and /languages (libretranslate.py).

Every bad request gets a 4xx whose JSON body is {"error": "<one line>"} and one log
line naming it. Bodies are read with a deadline, searches run on the batcher's
thread, and a request whose search has not been compiled yet (new options) waits
for its compile on a compile thread while the others are served (batcher.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import json
import logging

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from flax_transformer import provenance
from flax_transformer.errors import ConfigError
from flax_transformer.languages import Languages
from flax_transformer.serving import auth, hangup, language_api, libretranslate
from flax_transformer.serving.asgi import TrackedSend
from flax_transformer.serving.batcher import Batcher
from flax_transformer.serving.drain import Drain, Gate
from flax_transformer.serving.errors import RequestError
from flax_transformer.serving.page import PAGE
from flax_transformer.translation.search_config import MAX_ALPHA, SearchConfig
from flax_transformer.translation.translator import Translator

log = logging.getLogger("flax_transformer.serving")


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask for: sentences (LibreTranslate's q: texts) per request,
  body bytes, seconds to send the body, beam width, the grid its alpha is rounded to (0:
  none; on_grid), and characters per LibreTranslate text (split into sentences). Each
  alpha is a program to compile: on a grid, a server meets at most 10 / alpha_step + 2
  of them per beam width."""

  max_sentences: int = 64
  max_body_bytes: int = 1 << 20
  body_timeout_s: float = 10.0
  max_beam: int = 8
  alpha_step: float = 0.1
  max_chars: int = 5000  # LibreTranslate's charLimit: characters of one q text; -1: none.


def on_grid(alpha: float, step: float) -> float:
  """`alpha` rounded half up to a multiple of `step`, in decimal (0.25 -> 0.3 and 0.35 ->
  0.4 on 0.1's grid, where float division rounds them down), then capped at MAX_ALPHA
  (10 on 0.15's grid: 10.05 -> 10). As given if `step` is 0 or `alpha` is outside [0,
  MAX_ALPHA] or nan: SearchConfig refuses those."""
  if not step or not 0 <= alpha <= MAX_ALPHA:
    return alpha
  grid = decimal.Decimal(repr(step))
  steps = (decimal.Decimal(repr(alpha)) / grid).quantize(1, rounding=decimal.ROUND_HALF_UP)
  return min(float(steps * grid), MAX_ALPHA)


# Open without the token, as LibreTranslate's are: the page, the languages, its settings.
OPEN_ROUTES = frozenset({"/", "/languages", "/frontend/settings"})
# LibreTranslate's routes, whose api_key may come in the body: checked once it is read.
BODY_KEY_ROUTES = frozenset({"/translate", "/detect"})


class _Disconnected(Exception):
  """The client went away before its body was complete."""


class CatchAll:
  """ASGI middleware: an unexpected error gets a one-line JSON 500 and one log line.

  (Not an exception handler for Exception: Starlette re-raises after running one,
  and the server would log a traceback.)
  """

  def __init__(self, app):
    self.app = app

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    tracked = TrackedSend(send)
    try:
      await self.app(scope, receive, tracked)
    except Exception as e:  # noqa: BLE001 - the one place every other error ends up.
      what = " ".join(f"{type(e).__name__}: {e}".split())
      log.error("500 %s %s: %s", scope.get("method"), scope.get("path"), what)
      if not tracked.started:
        await JSONResponse({"error": f"internal error: {what}"}, status_code=500)(
            scope, receive, send)


class TranslateRequest(BaseModel):
  model_config = ConfigDict(extra="forbid", strict=True)
  text: list[str]
  beam_size: int | None = None
  alpha: float | None = None
  nbest: int | None = None
  prefix: list[str] | None = None
  source_lang: str | None = None  # 'auto': each text's detected (language_api.py).
  target_lang: str | None = None  # Needed where the model has several targets.


class ScoreRequest(BaseModel):
  model_config = ConfigDict(extra="forbid", strict=True)
  source: list[str]
  target: list[str]
  source_lang: str | None = None
  target_lang: str | None = None


def _one_line(error: ValidationError, model: type[BaseModel]) -> str:
  first = error.errors()[0]
  where = ".".join(str(part) for part in first["loc"])
  if first["type"] == "extra_forbidden":
    return f"unknown field {where!r} (fields: {', '.join(model.model_fields)})"
  if not where:
    return f"the body must be a JSON object with fields {', '.join(model.model_fields)}"
  return f"field {where!r}: {first['msg']}"


class _Requests:
  """Reading and checking requests: the token, the body (size, deadline), its JSON and
  schema, its sentences. Each check raises a RequestError naming what was wrong."""

  def __init__(self, batcher: Batcher, limits: Limits, token: str | None):
    self.batcher, self.limits, self.token = batcher, limits, token

  def check_token(self, request: Request) -> None:
    auth.check(self.token, auth.bearer(request), 401,
               "missing bearer token (header 'Authorization: Bearer <token>')", "bad bearer token")

  async def guard(self, request: Request) -> None:
    """The app's one token check, a dependency of every route: the bearer token, except
    on OPEN_ROUTES; BODY_KEY_ROUTES take LibreTranslate's api_key too, which may come in
    the body: their handlers check the token once it is read."""
    if request.url.path not in OPEN_ROUTES | BODY_KEY_ROUTES:
      self.check_token(request)

  async def _body(self, request: Request) -> bytes:
    most = self.limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > most:
      raise RequestError(413, f"body of {declared} bytes is over {most}")
    chunks, size = [], 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > most:
        raise RequestError(413, f"body is over {most} bytes")
      chunks.append(chunk)
    return b"".join(chunks)

  async def parse(self, request: Request, schema: type[BaseModel]):
    """The request's body as `schema` (its token checked by `guard`)."""
    return self.validate(await self.read(request), schema)

  async def read(self, request: Request) -> bytes:
    """The request's body, within its size and its deadline."""
    seconds = self.limits.body_timeout_s
    try:
      return await asyncio.wait_for(self._body(request), seconds)
    except ClientDisconnect:
      raise _Disconnected() from None
    except asyncio.TimeoutError:
      raise RequestError(408, f"body not received within {seconds:g} s") from None

  @staticmethod
  def validate(body: bytes, schema: type[BaseModel]):
    """`body` (JSON) as `schema`."""
    try:
      data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # Recursion: nested deep.
      raise RequestError(400, f"malformed JSON: {e}") from None
    try:
      return schema.model_validate(data)
    except ValidationError as e:
      raise RequestError(422, _one_line(e, schema)) from None

  def check_sentences(self, field: str, sentences: list[str], length_of=None,
                      most: int | None = None) -> None:
    """How many, valid text, and each at most `most` tokens long (default max_tokens;
    `length_of`: default, as a source)."""
    length_of = length_of or self.batcher.source_length
    most = most or self.batcher.max_tokens
    if len(sentences) > self.limits.max_sentences:
      raise RequestError(413, f"too many sentences in {field!r}: {len(sentences)} > "
                              f"{self.limits.max_sentences} (--max_sentences)")
    for i, sentence in enumerate(sentences):
      try:  # JSON admits lone surrogates ("\\ud800"); the tokenizer does not.
        sentence.encode("utf-8")
      except UnicodeEncodeError as e:
        raise RequestError(422, f"{field}[{i}] is not valid text: {e.reason} at "
                                f"character {e.start}") from None
      length = length_of(sentence)
      if length > most:
        limit = "--max_tokens" if most == self.batcher.max_tokens else "the model's max_len - 1"
        raise RequestError(413, f"{field}[{i}] is {length} tokens long, over {most} ({limit})")

  @staticmethod
  def check_paired(field: str, items: list[str], other: str, others: list[str]) -> None:
    if len(items) != len(others):
      raise RequestError(422, f"{field!r} has {len(items)} entries, {other!r} {len(others)}")

  def search_of(self, body: TranslateRequest) -> SearchConfig:
    """The server's default search with the request's options."""
    default = self.batcher.default_search
    beam_size = default.beam_size if body.beam_size is None else body.beam_size
    if not 1 <= beam_size <= self.limits.max_beam:
      raise RequestError(422, f"beam_size must be in [1, {self.limits.max_beam}], got "
                              f"{beam_size}")
    alpha = None if body.alpha is None else on_grid(body.alpha, self.limits.alpha_step)
    try:
      search = dataclasses.replace(
          default, beam_size=beam_size, alpha=default.alpha if alpha is None else alpha,
          nbest=default.nbest if body.nbest is None else body.nbest)
      self.batcher.check_fits(search)  # A new option set: will its largest batch fit?
    except ConfigError as e:  # SearchConfig's check, decode.py's too (alpha in [0, 10], ...).
      raise RequestError(422, str(e)) from None
    return search


def _health(translator: Translator, batcher: Batcher, workdir: str, limits: Limits) -> dict:
  """/health's answer but the batching counts: the model, its steps, the commit, defaults."""
  model = translator.model_config
  return {"status": "ok",
          "model": {"workdir": str(workdir), "members": len(translator.model_configs),
                    "d_model": model.d_model, "num_layers": model.num_layers,
                    # The vocabulary's ids, not an import's padded rows (never produced).
                    "vocab_size": model.without_vocab_padding().vocab_size,
                    "max_len": model.max_len},
          "steps_averaged": [list(s) for s in translator.checkpoint_steps or ()],
          "commit": provenance.commit(),
          "search": dataclasses.asdict(batcher.default_search),
          "limits": {**dataclasses.asdict(limits), "max_tokens": batcher.max_tokens}}


def _add_error_handlers(app: FastAPI) -> None:
  """Bad requests: {"error": one line} and one log line; a dropped body: a log line."""

  @app.exception_handler(RequestError)
  async def bad_request(request: Request, error: RequestError):
    client = request.client.host if request.client else "?"
    log.warning("%d %s %s from %s: %s", error.status, request.method, request.url.path, client,
                error)
    return JSONResponse({"error": str(error)}, status_code=error.status)

  @app.exception_handler(_Disconnected)
  async def disconnected(request: Request, error: _Disconnected):
    client = request.client.host if request.client else "?"
    log.warning("%s %s from %s: client disconnected before its body was complete; dropped",
                request.method, request.url.path, client)
    return Response(status_code=400)  # Nobody reads it.

  @app.exception_handler(StarletteHTTPException)
  async def http_error(request: Request, error: StarletteHTTPException):
    return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)


def _add_routes(app: FastAPI, requests: _Requests, batcher: Batcher, health: dict,
                face: libretranslate.LibreTranslate, drain: Drain) -> None:
  @app.get("/", response_class=HTMLResponse)
  async def page():
    return PAGE

  @app.get("/health")
  async def get_health():
    # In flight: requests the server has begun to read and not yet answered, this one aside.
    return {**health, "batching": dict(batcher.stats), "in_flight": drain.in_flight - 1}

  @app.get("/languages")
  async def get_languages():  # Open, as LibreTranslate's: it names the pair only.
    return face.languages()

  @app.post("/translate")
  async def translate(request: Request):
    # A token outside the body (a bearer header, for either API, or LibreTranslate's
    # api_key in the query string) is checked before the body is read; only one inside
    # it (LibreTranslate's api_key) waits for the body.
    if auth.bearer(request) is not None:
      requests.check_token(request)
    checked = auth.bearer(request) is not None or face.check_query_key(request)
    raw = await requests.read(request)
    fields = await libretranslate.fields_of(request, raw)  # A LibreTranslate request?
    if fields is not None:
      return await face.translate(fields, key_checked=checked)
    if not checked:
      requests.check_token(request)
    body = requests.validate(raw, TranslateRequest)
    requests.check_sentences("text", body.text)
    search = requests.search_of(body)
    if body.prefix is not None:
      requests.check_paired("prefix", body.prefix, "text", body.text)
      # A forced prefix leaves room for EOS within the model's max_len (as Translator).
      requests.check_sentences("prefix", body.prefix, batcher.prefix_length,
                               min(batcher.max_tokens, batcher.max_len - 1))
    directions = face.api.directions(body.text, body.source_lang, body.target_lang)
    found = await asyncio.wrap_future(batcher.translate(body.text, search, body.prefix,
                                                        directions))
    answer = {"translations": [hyps[0][0] for hyps in found]}
    if body.alpha is not None:  # The alpha searched with: the request's, on the grid.
      answer["alpha"] = search.alpha
    if search.nbest > 1:
      answer["nbest"] = [[{"text": text, "score": score} for text, score in hyps]
                         for hyps in found]
    return answer

  app.add_api_route("/frontend/settings", face.settings)  # Open, as LibreTranslate's.

  _add_detect_and_score(app, requests, batcher, face)


def _add_detect_and_score(app: FastAPI, requests: _Requests, batcher: Batcher,
                          face: libretranslate.LibreTranslate) -> None:
  @app.post("/detect")
  async def detect(request: Request):  # LibreTranslate's: q -> its language, best first.
    checked = auth.bearer(request) is not None or face.check_query_key(request)
    if auth.bearer(request) is not None:
      requests.check_token(request)
    raw = await requests.read(request)
    return face.detect(await libretranslate.fields_of(request, raw) or {}, checked)

  @app.post("/score")
  async def score(request: Request):
    body = await requests.parse(request, ScoreRequest)
    requests.check_paired("source", body.source, "target", body.target)
    requests.check_sentences("source", body.source)
    requests.check_sentences("target", body.target)
    directions = face.api.directions(body.source, body.source_lang, body.target_lang)
    return {"scores": await asyncio.wrap_future(batcher.score(body.source, body.target,
                                                              directions))}


def make_app(translator: Translator, batcher: Batcher, *, workdir: str, token: str | None = None,
             limits: Limits = Limits(), drain: Drain | None = None,
             languages: Languages | tuple[str, str] | None = None) -> FastAPI:
  """The app serving `translator`'s model through `batcher`; `token`: when set, API calls
  need the header `Authorization: Bearer <token>`; `drain`: what a shutdown drains
  (drain.run); `languages`: what the model translates between (default: the
  translator's record; a (source, target) pair names a model's one pair)."""
  requests = _Requests(batcher, limits, token)
  # One token check for every route, those added later too (`_Requests.guard`).
  app = FastAPI(title="flax-transformer", docs_url=None, redoc_url=None, openapi_url=None,
                dependencies=[Depends(requests.guard)])
  app.add_middleware(hangup.CancelOnDisconnect)  # Innermost: a hang-up cancels the handler.
  app.add_middleware(CatchAll)
  drain = drain or Drain()
  app.add_middleware(Gate, drain=drain)  # Outside the handlers: it sees CancelledError.
  app.add_middleware(libretranslate.Cors)  # Outermost: the 503s of a drain get its headers.
  _add_error_handlers(app)
  face = libretranslate.LibreTranslate(language_api.for_model(
      translator.languages if languages is None else languages), token, batcher, limits)
  _add_routes(app, requests, batcher,
              _health(translator, batcher, workdir, limits), face, drain)
  return app
