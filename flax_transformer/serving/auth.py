"""Who may call serve.py's API: the token, presented as a bearer header (serve.py's own
API) or as LibreTranslate's api_key, compared in constant time."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from flax_transformer.serving.errors import RequestError


def bearer(request: Request) -> str | None:
  """The token of an `Authorization: Bearer <token>` header, or None."""
  scheme, _, value = request.headers.get("authorization", "").partition(" ")
  return value.strip() or None if scheme.lower() == "bearer" else None


def check(token: str | None, presented, status: int, missing: str, wrong: str) -> None:
  """Raises RequestError(status, missing) if nothing (or no string) was `presented`,
  RequestError(status, wrong) unless it is `token`; nothing if the server has no token."""
  if token is None:
    return
  if not isinstance(presented, str) or not presented:
    raise RequestError(status, missing)
  try:
    presented_bytes = presented.encode()
  except UnicodeEncodeError:  # JSON admits lone surrogates ("\ud800").
    raise RequestError(status, wrong) from None
  if not hmac.compare_digest(presented_bytes, token.encode()):
    raise RequestError(status, wrong)
