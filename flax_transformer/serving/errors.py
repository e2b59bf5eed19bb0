"""A bad request, as serve.py's APIs (app.py, libretranslate.py) refuse it."""


class RequestError(Exception):
  """A bad request: its HTTP status and the one line that says what was wrong."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status
