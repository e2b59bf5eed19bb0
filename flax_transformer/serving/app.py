"""The HTTP API (FastAPI): /translate, /score, /health, and the page at /.

Every bad request gets a 4xx whose JSON body is {"error": "<one line>"} and one log
line naming it. Bodies are read with a deadline, searches run on the batcher's
thread, and a request whose search has not been compiled yet (new options) waits
for its compile on a compile thread while the others are served (batcher.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import inspect
import json
import logging

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from flax_transformer import provenance
from flax_transformer.errors import ConfigError
from flax_transformer.serving.batcher import Batcher
from flax_transformer.serving.page import PAGE
from flax_transformer.translation.translator import Translator

log = logging.getLogger("flax_transformer.serving")


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask for: sentences per request, body bytes, seconds to send
  the body, beam width."""

  max_sentences: int = 64
  max_body_bytes: int = 1 << 20
  body_timeout_s: float = 10.0
  max_beam: int = 8


class RequestError(Exception):
  """A bad request: its HTTP status and the one line that says what was wrong."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


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
    started = False

    async def send_tracked(message):
      nonlocal started
      started = started or message["type"] == "http.response.start"
      await send(message)

    try:
      await self.app(scope, receive, send_tracked)
    except Exception as e:  # noqa: BLE001 - the one place every other error ends up.
      what = " ".join(f"{type(e).__name__}: {e}".split())
      log.error("500 %s %s: %s", scope.get("method"), scope.get("path"), what)
      if not started:
        await JSONResponse({"error": f"internal error: {what}"}, status_code=500)(
            scope, receive, send)


class TranslateRequest(BaseModel):
  model_config = ConfigDict(extra="forbid", strict=True)
  text: list[str]
  beam_size: int | None = None
  alpha: float | None = None
  nbest: int | None = None
  prefix: list[str] | None = None


class ScoreRequest(BaseModel):
  model_config = ConfigDict(extra="forbid", strict=True)
  source: list[str]
  target: list[str]


def _one_line(error: ValidationError, model: type[BaseModel]) -> str:
  first = error.errors()[0]
  where = ".".join(str(part) for part in first["loc"])
  if first["type"] == "extra_forbidden":
    return f"unknown field {where!r} (fields: {', '.join(model.model_fields)})"
  if not where:
    return f"the body must be a JSON object with fields {', '.join(model.model_fields)}"
  return f"field {where!r}: {first['msg']}"


def _supports_prefixes(translator: Translator) -> bool:
  return "prefixes" in inspect.signature(translator.translate_nbest).parameters


def make_app(translator: Translator, batcher: Batcher, *, workdir: str, token: str | None = None,
             limits: Limits = Limits()) -> FastAPI:
  """The app serving `translator`'s model through `batcher`; `token`: when set, API calls
  need the header `Authorization: Bearer <token>`."""
  app = FastAPI(title="flax-transformer", docs_url=None, redoc_url=None, openapi_url=None)
  app.add_middleware(CatchAll)
  can_prefix = _supports_prefixes(translator)
  can_score = hasattr(translator, "score")
  model = translator.model_config
  health = {"status": "ok",
            "model": {"workdir": str(workdir), "members": len(translator.model_configs),
                      "d_model": model.d_model, "num_layers": model.num_layers,
                      "vocab_size": model.vocab_size, "max_len": model.max_len},
            "steps_averaged": [list(s) for s in translator.checkpoint_steps or ()],
            "commit": provenance.commit(),
            "search": dataclasses.asdict(batcher.default_search),
            "limits": {**dataclasses.asdict(limits), "max_tokens": batcher.max_tokens},
            "features": {"prefix": can_prefix, "score": can_score}}

  def check_token(request: Request) -> None:
    if token is None:
      return
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not value:
      raise RequestError(401, "missing bearer token (header 'Authorization: Bearer <token>')")
    if not hmac.compare_digest(value.strip().encode(), token.encode()):
      raise RequestError(401, "bad bearer token")

  async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
      raise RequestError(413, f"body of {declared} bytes is over {limits.max_body_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > limits.max_body_bytes:
        raise RequestError(413, f"body is over {limits.max_body_bytes} bytes")
      chunks.append(chunk)
    return b"".join(chunks)

  async def parse(request: Request, schema: type[BaseModel]):
    check_token(request)
    try:
      body = await asyncio.wait_for(read_body(request), limits.body_timeout_s)
    except ClientDisconnect:
      raise _Disconnected() from None
    except asyncio.TimeoutError:
      raise RequestError(408, f"body not received within {limits.body_timeout_s:g} s") from None
    try:
      data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # Recursion: nested deep.
      raise RequestError(400, f"malformed JSON: {e}") from None
    try:
      return schema.model_validate(data)
    except ValidationError as e:
      raise RequestError(422, _one_line(e, schema)) from None

  def check_sentences(field: str, sentences: list[str], length_of=batcher.source_length
                      ) -> None:
    if len(sentences) > limits.max_sentences:
      raise RequestError(413, f"too many sentences in {field!r}: {len(sentences)} > "
                              f"{limits.max_sentences} (--max_sentences)")
    for i, sentence in enumerate(sentences):
      try:  # JSON admits lone surrogates ("\\ud800"); the tokenizer does not.
        sentence.encode("utf-8")
      except UnicodeEncodeError as e:
        raise RequestError(422, f"{field}[{i}] is not valid text: {e.reason} at "
                                f"character {e.start}") from None
      length = length_of(sentence)
      if length > batcher.max_tokens:
        raise RequestError(413, f"{field}[{i}] is {length} tokens long, over "
                                f"{batcher.max_tokens} (--max_tokens)")

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

  @app.get("/", response_class=HTMLResponse)
  async def page():
    return PAGE

  @app.get("/health")
  async def get_health(request: Request):
    check_token(request)
    return {**health, "batching": dict(batcher.stats)}

  @app.post("/translate")
  async def translate(request: Request):
    body = await parse(request, TranslateRequest)
    check_sentences("text", body.text)
    default = batcher.default_search
    beam_size = default.beam_size if body.beam_size is None else body.beam_size
    if not 1 <= beam_size <= limits.max_beam:
      raise RequestError(422, f"beam_size must be in [1, {limits.max_beam}], got {beam_size}")
    try:
      search = dataclasses.replace(
          default, beam_size=beam_size,
          alpha=default.alpha if body.alpha is None else body.alpha,
          nbest=default.nbest if body.nbest is None else body.nbest)
    except ConfigError as e:
      raise RequestError(422, str(e)) from None
    if not 0 <= search.alpha <= 10:
      raise RequestError(422, f"alpha must be in [0, 10], got {search.alpha}")
    if body.prefix is not None:
      if not can_prefix:
        raise RequestError(501, "'prefix' is not available in this version")
      if len(body.prefix) != len(body.text):
        raise RequestError(422, f"'prefix' has {len(body.prefix)} entries, 'text' "
                                f"{len(body.text)}")
      check_sentences("prefix", body.prefix, batcher.prefix_length)
    found = await asyncio.wrap_future(batcher.translate(body.text, search, body.prefix))
    answer = {"translations": [hyps[0][0] for hyps in found]}
    if search.nbest > 1:
      answer["nbest"] = [[{"text": text, "score": score} for text, score in hyps]
                         for hyps in found]
    return answer

  @app.post("/score")
  async def score(request: Request):
    body = await parse(request, ScoreRequest)
    if not can_score:
      raise RequestError(501, "/score is not available in this version")
    if len(body.source) != len(body.target):
      raise RequestError(422, f"'source' has {len(body.source)} entries, 'target' "
                              f"{len(body.target)}")
    check_sentences("source", body.source)
    check_sentences("target", body.target)
    found = await asyncio.wrap_future(batcher.score(body.source, body.target))
    return {"scores": found}

  return app
