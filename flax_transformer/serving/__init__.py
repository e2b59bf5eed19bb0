"""serve.py's library part: dynamic batching over `Translator`s and the HTTP app."""
