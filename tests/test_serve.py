"""serve.py (the HTTP API, dynamic batching, bad input, the page in a real browser) and
decode.py --interactive, on the session's trained tiny run (conftest.trained_tiny).

One server for the module: 2 CPU devices, sources up to 16 tokens, batches of up to 8
sentences (shapes [2, 16], [4, 16] and [8, 16], compiled before it answers /health).
"""

import concurrent.futures
import contextlib
import dataclasses
import http.client
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jax
import pytest

import conftest
from conftest import ROOT, TRAINED_TINY_CHECKPOINTS, cpu_env
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator

TOKEN = "test-token-5f2c"
MAX_SENTENCES = 8
SENTENCES = ["A dog runs in the park.", "Two men are playing football.", "A woman reads a book.",
             "Children play in the snow.", "A man rides a red bike.", "", "A cat sleeps.",
             "People walk down the street."]
# Short searches (as test_decoding's): outputs of at most source + 5 tokens.
SEARCH = SearchConfig(max_extra=5)


class Server:
  def __init__(self, url: str, log: Path, process: subprocess.Popen):
    self.url, self.log, self.process = url, log, process

  def call(self, path: str, body=None, *, token: str | None = TOKEN, raw: bytes | None = None
           ) -> tuple[int, dict]:
    """(status, JSON answer) of GET (body None) or POST `body` (JSON) / `raw` bytes."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(self.url + path, data=data,
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
      with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
      return e.code, json.loads(e.read())

  def stats(self) -> dict:
    return self.call("/health")[1]["batching"]


@pytest.fixture(scope="module")
def server(trained_tiny, tmp_path_factory):
  """serve.py on a port of its choosing (--port=0: its 'Serving' line names it), the token
  from the environment (SERVE_TOKEN, not the command line)."""
  log = tmp_path_factory.mktemp("serve") / "serve.log"
  with open(log, "wb") as out:
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "serve.py"), f"--workdir={trained_tiny}", "--port=0",
         "--cpu_devices=2", "--max_tokens=16", "--max_batch=8",
         f"--max_sentences={MAX_SENTENCES}", "--max_extra=5", "--max_wait_ms=50",
         "--body_timeout_s=2", f"--compilation_cache_dir={conftest.XLA_CACHE}"],
        stdout=out, stderr=subprocess.STDOUT, env=dict(cpu_env(), SERVE_TOKEN=TOKEN))
  deadline = time.time() + 240
  while not (serving := re.search(r"Serving \S+ on (http://127\.0\.0\.1:(\d+))/",
                                  log.read_text())):
    assert process.poll() is None and time.time() < deadline, log.read_text()[-3000:]
    time.sleep(0.3)
  assert int(serving[2]) > 0
  running = Server(serving[1], log, process)
  assert running.call("/health")[0] == 200
  yield running
  process.terminate()
  try:
    process.wait(timeout=30)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def translator(trained_tiny):
  """The server's model and search, in this process: what every answer must equal."""
  # The server's devices and batch shape: [8, 16] on 2 devices.
  return Translator.from_workdir(trained_tiny, search=SEARCH, average_last=5, batch_tokens=128,
                                 devices=jax.devices()[:2])


@pytest.fixture(scope="module")
def expected(translator):
  return translator.translate(SENTENCES)


def test_health_names_the_model_the_steps_and_the_commit(server, trained_tiny):
  status, health = server.call("/health")
  assert status == 200
  assert health["model"]["workdir"] == str(trained_tiny)
  assert health["steps_averaged"] == [list(TRAINED_TINY_CHECKPOINTS)]
  assert len(health["commit"]["git_commit"]) == 40
  assert health["search"]["beam_size"] == SEARCH.beam_size
  assert health["in_flight"] == 0  # Requests begun and not answered, this one aside.


def test_translate_and_concurrent_requests_batched_equal_the_translator(server, expected):
  status, answer = server.call("/translate", {"text": SENTENCES})
  assert status == 200 and answer == {"translations": expected}
  before = server.stats()
  start = threading.Barrier(len(SENTENCES))

  def one(sentence):
    start.wait()
    return server.call("/translate", {"text": [sentence]})

  with concurrent.futures.ThreadPoolExecutor(len(SENTENCES)) as pool:
    answers = list(pool.map(one, SENTENCES))
  assert answers == [(200, {"translations": [e]}) for e in expected]
  after = server.stats()
  assert after["requests"] - before["requests"] == len(SENTENCES)  # /health counts none.
  # Gathered: fewer searches than requests (each search is one [rows, 16] batch).
  assert after["searches"] - before["searches"] < len(SENTENCES) - 1, (before, after)


def test_options_nbest_prefix_and_score(server, translator, expected):
  status, answer = server.call("/translate", {"text": SENTENCES[:2] + [""], "nbest": 3})
  assert status == 200
  # An empty sentence has its 3 too (empty, score 0), as decode.py's K lines per input.
  assert [len(hyps) for hyps in answer["nbest"]] == [3, 3, 3]
  assert answer["nbest"][2] == [{"text": "", "score": 0.0}] * 3
  assert answer["translations"] == expected[:2] + [""]
  assert [hyps[0]["text"] for hyps in answer["nbest"]] == answer["translations"]
  for hyps in answer["nbest"]:
    scores = [h["score"] for h in hyps]
    assert scores == sorted(scores, reverse=True)
  status, answer = server.call("/translate", {"text": SENTENCES[:2], "prefix": ["Ein Hund", ""]})
  assert status == 200
  assert answer["translations"][0].startswith("Ein Hund")
  assert answer["translations"][1] == expected[1]  # An empty prefix forces nothing.
  pairs = [SENTENCES[0], SENTENCES[1]], [expected[0], "Zwei Männer spielen Fußball."]
  status, answer = server.call("/score", {"source": pairs[0], "target": pairs[1]})
  assert status == 200
  for got, (logprob, tokens) in zip(answer["scores"], translator.score(*pairs)):
    assert got["tokens"] == tokens and got["logprob"] == pytest.approx(logprob, abs=1e-4)
  # Every search without a prefix, n-best ones too, ran a program warmed before serving.
  log = server.log.read_text()
  pattern = r"Beam search for inputs \[\d+, \d+\] (compiled|loaded)"
  warmed = [m.start() for m in re.finditer(pattern, log)]  # Rows [2, 4, 8] x width 16.
  assert len(warmed) == 3 and max(warmed) < log.index("Serving "), log


def _timed_call(server, body) -> tuple[tuple[int, dict], float]:
  """((status, answer), when it came back) of POST /translate `body`."""
  answer = server.call("/translate", body)
  return answer, time.perf_counter()


def test_a_new_option_set_compiles_without_holding_up_other_requests(server, expected):
  # No earlier test asks for alpha 0.7, and the session's compilation cache is its own:
  # its search compiles now (seconds), a default search takes a few ms.
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    handed = lambda: server.log.read_text().count("other requests are served meanwhile")  # noqa: E731
    before = handed()
    new = pool.submit(_timed_call, server, {"text": [SENTENCES[0]], "alpha": 0.7})
    deadline = time.time() + 60  # Until the search thread has handed it to the compiler.
    while handed() == before:
      assert time.time() < deadline and not new.done(), server.log.read_text()[-3000:]
      time.sleep(0.02)
    others = [_timed_call(server, {"text": [s]}) for s in SENTENCES[:3]]
    (status, answer), new_done = new.result()
  assert status == 200 and len(answer["translations"]) == 1
  assert [a for a, _ in others] == [(200, {"translations": [e]}) for e in expected[:3]]
  assert max(t for _, t in others) < new_done, "the default requests waited for the compile"
  assert answer["alpha"] == 0.7  # The alpha searched with, when the request sends one.
  # alpha on serve.py's grid (--alpha_step 0.1): 0.68, 0.65 (half up) and 0.7 are one
  # program, compiled once; the default's alpha sent explicitly is the default's.
  compiles = server.log.read_text().count("Compiling SearchConfig")
  for alpha in (0.68, 0.65):
    assert server.call("/translate", {"text": [SENTENCES[0]], "alpha": alpha}) == (status, answer)
  assert server.log.read_text().count("Compiling SearchConfig") == compiles
  assert server.call("/translate", {"text": [SENTENCES[0]], "alpha": SEARCH.alpha}) == (
      200, {"translations": expected[:1], "alpha": SEARCH.alpha})
  assert server.call("/health")[1]["limits"]["alpha_step"] == 0.1


def test_concurrent_requests_with_different_options_equal_each_sent_alone(server):
  bodies = [{"text": [SENTENCES[0]]}, {"text": [SENTENCES[1]], "beam_size": 2},
            {"text": SENTENCES[2:4], "prefix": ["Eine", ""]},
            {"text": [SENTENCES[4]], "nbest": 2}, {"text": [SENTENCES[6]], "alpha": 0.7}]
  alone = [server.call("/translate", body) for body in bodies]
  assert [status for status, _ in alone] == [200] * len(bodies), alone
  before = server.stats()
  start = threading.Barrier(len(bodies))

  def one(body):
    start.wait()
    return server.call("/translate", body)

  with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
    together = list(pool.map(one, bodies))
  assert together == alone
  assert server.stats()["requests"] - before["requests"] == len(bodies)


def test_a_requests_alpha_is_rounded_half_up_on_a_decimal_grid_within_0_10():
  """At 8795e60 halves went down (0.25 -> 0.2: float division and round's ties to even),
  0.15's grid took 10 to 10.05 (a 422), and 50's took every alpha to 0."""
  from flax_transformer.serving.app import on_grid

  cases = {(0.25, 0.1): 0.3, (0.35, 0.1): 0.4, (0.65, 0.1): 0.7, (0.68, 0.1): 0.7,
           (0.3, 0.1): 0.3, (0.6, 0.1): 0.6, (0.07, 0.05): 0.05, (0.075, 0.05): 0.1,
           (10, 0.15): 10.0, (9.9, 0.15): 9.9, (10, 10): 10.0, (4.9, 10): 0.0, (5, 10): 10.0,
           (0.123, 0): 0.123, (10.5, 0.1): 10.5, (-0.5, 0.1): -0.5}  # Refused by SearchConfig.
  assert {case: on_grid(*case) for case in cases} == cases


def test_serve_py_refuses_a_nan_flag_and_an_alpha_off_its_grid_in_one_line(tmp_path):
  """Before anything is loaded (the workdir does not exist). At 8795e60 nan passed every
  float flag's bounds, --alpha_step had no upper one, and --alpha=0.65 served a request
  that sent 0.65 with 0.6."""
  refused = {"--alpha_step=nan": "--alpha_step must be a finite number, got nan",
             "--drain_s=nan": "--drain_s must be a finite number, got nan",
             "--max_wait_ms=inf": "--max_wait_ms must be a finite number, got inf",
             "--alpha_step=50": "--alpha_step must be in [0.001, 10], or 0 for alphas as sent, "
                                "got 50",
             "--alpha_step=-0.1": "--alpha_step must be in [0.001, 10], or 0 for alphas as "
                                  "sent, got -0.1",
             "--alpha_step=1e-30": "--alpha_step must be in [0.001, 10], or 0 for alphas as "
                                   "sent, got 1e-30",
             "--languages=en,": "--languages takes SOURCE,TARGET (two codes, as en,de), got "
                                "'en,'",
             "--max_chars=0": "--max_chars must be at least 1, or -1 for no limit, got 0",
             "--alpha=0.65": "--alpha 0.65 is off --alpha_step 0.1's grid (a request's alpha "
                             "0.65 would be searched as 0.7)"}
  runs = {flag: subprocess.Popen([sys.executable, str(ROOT / "serve.py"),
                                  f"--workdir={tmp_path / 'none'}", flag],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cpu_env())
          for flag in refused}
  stderr = {flag: text.decode().strip() for flag, text in
            conftest.stderr_of_each(runs, timeout=120).items()}
  assert [runs[flag].returncode for flag in runs] == [2] * len(runs), stderr
  for flag, words in refused.items():
    assert stderr[flag] == f"error: {words}" or (flag == "--alpha=0.65" and stderr[
        flag].startswith(f"error: {words}: ")), (flag, stderr[flag])
    assert "Traceback" not in stderr[flag] and "none" not in stderr[flag], stderr[flag]


BAD = [  # (what, request arguments, status, words of the one-line error)
    ("malformed JSON", dict(raw=b'{"text": ["A dog'), 400, "malformed JSON"),
    ("not an object", dict(body=["A dog."]), 422, "JSON object"),
    ("wrong type", dict(body={"text": "A dog."}), 422, "field 'text'"),
    ("wrong item type", dict(body={"text": [3]}), 422, "field 'text.0'"),
    ("unknown field", dict(body={"text": ["A dog."], "beam": 2}), 422, "unknown field 'beam'"),
    ("too many sentences", dict(body={"text": ["A dog."] * (MAX_SENTENCES + 1)}), 413,
     "too many sentences"),
    ("over-long sentence", dict(body={"text": ["A dog runs " * 10]}), 413,
     "over 16 (--max_tokens)"),
    ("nested too deeply", dict(raw=b"[" * 50000), 400, "malformed JSON"),
    ("nested field", dict(raw=b'{"text": ' + b"[" * 50000), 400, "malformed JSON"),
    ("lone surrogate", dict(body={"text": ["A dog \ud800."]}), 422, "text[0] is not valid text"),
    ("beam too wide", dict(body={"text": ["A dog."], "beam_size": 99}), 422, "beam_size"),
    ("nbest over beam", dict(body={"text": ["A dog."], "beam_size": 2, "nbest": 3}), 422,
     "nbest"),
    # The search options' one check (SearchConfig's, decode.py's flags: test_decoding).
    ("beam 0", dict(body={"text": ["A dog."], "beam_size": 0}), 422,
     "beam_size must be in [1, 8]"),
    ("nbest 0", dict(body={"text": ["A dog."], "nbest": 0}), 422,
     "nbest must be in [1, beam_size=4], got 0"),
    ("alpha below 0", dict(body={"text": ["A dog."], "alpha": -0.5}), 422,
     "alpha must be in [0, 10], got -0.5"),
    ("alpha above 10", dict(body={"text": ["A dog."], "alpha": 10.5}), 422,
     "alpha must be in [0, 10], got 10.5"),
    ("alpha NaN", dict(raw=b'{"text": ["A dog."], "alpha": NaN}'), 422,
     "alpha must be in [0, 10], got nan"),
    ("alpha infinite", dict(raw=b'{"text": ["A dog."], "alpha": Infinity}'), 422,
     "alpha must be in [0, 10], got inf"),
    ("prefix count", dict(body={"text": ["A dog."], "prefix": []}), 422, "'prefix' has 0"),
    ("no token", dict(body={"text": ["A dog."]}, token=None), 401, "missing bearer token"),
    ("bad token", dict(body={"text": ["A dog."]}, token="guess"), 401, "bad bearer token"),
]


def test_bad_input_gets_a_4xx_with_one_line_and_one_log_line(server):
  for what, arguments, status, words in BAD:
    got, answer = server.call("/translate", **arguments)
    assert (got, list(answer)) == (status, ["error"]), what
    assert words in answer["error"] and "\n" not in answer["error"], (what, answer)
  assert server.call("/translate", {"text": [SENTENCES[0]]})[0] == 200
  log = server.log.read_text()
  for what, _, status, words in BAD:
    assert any(f"{status} POST /translate" in line and words in line
               for line in log.splitlines()), what
  assert "Traceback" not in log and " 500 " not in log


def test_an_unexpected_error_gets_a_one_line_json_500_and_one_log_line(caplog):
  import asyncio

  from flax_transformer.serving.app import CatchAll

  async def failing(scope, receive, send):
    raise RuntimeError("search failed\non two lines")

  sent = []

  async def send(message):
    sent.append(message)

  scope = {"type": "http", "method": "POST", "path": "/translate", "headers": []}
  asyncio.run(CatchAll(failing)(scope, None, send))
  assert sent[0]["status"] == 500
  assert json.loads(sent[1]["body"]) == {
      "error": "internal error: RuntimeError: search failed on two lines"}
  assert [r.getMessage() for r in caplog.records] == [
      "500 POST /translate: RuntimeError: search failed on two lines"]


def test_a_request_cut_off_mid_body_is_dropped_and_a_stalled_one_times_out(server, expected):
  head = (b"POST /translate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
          + b"\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{\"text\": [\"A")
  cut = socket.create_connection(server.url.removeprefix("http://").split(":"))
  cut.sendall(head)
  cut.close()
  stalled = socket.create_connection(server.url.removeprefix("http://").split(":"))
  stalled.sendall(head)
  started = time.time()
  # Others are served meanwhile, and at once (the stalled body holds no search).
  assert server.call("/translate", {"text": [SENTENCES[1]]}) == (200, {"translations":
                                                                       [expected[1]]})
  stalled.settimeout(30)
  reply = http.client.HTTPResponse(stalled)
  reply.begin()
  assert (reply.status, json.loads(reply.read())) == (408, {"error": "body not received "
                                                                     "within 2 s"})
  stalled.close()
  assert 1.5 < time.time() - started < 20
  log = server.log.read_text()
  assert "client disconnected before its body was complete; dropped" in log
  assert "Traceback" not in log


@contextlib.contextmanager
def headless_chromium():
  """Debian's chromium, driven by selenium (test_multilingual.py's page test too)."""
  if not Path("/usr/bin/chromium").exists() and not os.environ.get("CI"):
    pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
  from selenium import webdriver
  from selenium.webdriver.chrome.service import Service

  options = webdriver.ChromeOptions()
  options.binary_location = "/usr/bin/chromium"
  for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
    options.add_argument(argument)
  browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
  try:
    yield browser
  finally:
    browser.quit()


def translations_shown(browser, seconds: float) -> list[str]:
  """Clicks the page's Translate and returns the translations it shows, once it marks them
  done (within `seconds`), asserting it shows no error (test_multilingual.py's page test
  too)."""
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import WebDriverWait

  browser.find_element(By.ID, "translate").click()
  WebDriverWait(browser, seconds).until(
      lambda b: b.find_element(By.ID, "translations").get_attribute("data-done")
      or b.find_element(By.ID, "error").text)
  assert browser.find_element(By.ID, "error").text == ""
  return [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#translations li")]


def test_the_page_translates_in_headless_chromium(server, expected):
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import WebDriverWait

  with headless_chromium() as browser:
    browser.get(server.url + "/")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "source").send_keys(SENTENCES[0] + "\n" + SENTENCES[1])
    # Beam and alpha: not sent unless set (the server's defaults, shown from /health).
    WebDriverWait(browser, 30).until(
        lambda b: b.find_element(By.ID, "alpha").get_attribute("placeholder"))
    fields = {f: browser.find_element(By.ID, f) for f in ("beam_size", "alpha")}
    assert {f: (e.get_attribute("value"), e.get_attribute("placeholder"))
            for f, e in fields.items()} == {"beam_size": ("", str(SEARCH.beam_size)),
                                            "alpha": ("", str(SEARCH.alpha))}
    # The page shows text as rendered: runs of spaces collapse, as in the browser.
    assert translations_shown(browser, 60) == [" ".join(e.split()) for e in expected[:2]]


def _line_within(stream, seconds: float) -> bytes:
  """One line from a pipe, or an assertion error after `seconds` without one."""
  line, deadline = b"", time.time() + seconds
  while not line.endswith(b"\n"):
    ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.time()))
    assert ready, f"no line within {seconds} s (got {line!r})"
    chunk = os.read(stream.fileno(), 1)
    assert chunk, f"stream closed (got {line!r})"
    line += chunk
  return line


def test_interactive_decode_answers_each_line_before_the_next_is_written(trained_tiny, expected):
  process = subprocess.Popen(
      [sys.executable, str(ROOT / "decode.py"), f"--workdir={trained_tiny}", "--interactive",
       "--max_extra=5", "--cpu_devices=2", f"--compilation_cache_dir={conftest.XLA_CACHE}"],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=cpu_env())
  try:
    for i, sentence in enumerate(SENTENCES[:3]):
      end = b"\r\n" if i == 1 else b"\n"  # A Windows line: answered with its ending.
      process.stdin.write(sentence.encode() + end)
      process.stdin.flush()  # The pipe stays open: a batch reader would wait for more.
      # The first line waits for the search to compile; later ones only for their search.
      assert _line_within(process.stdout, 120 if i == 0 else 30) == expected[i].encode() + end
    process.stdin.close()
    assert process.wait(timeout=30) == 0
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()


def test_interactive_split_sentences_translates_each_line_as_a_text(trained_tiny, tmp_path):
  """decode.py --interactive --split_sentences: each line split into its sentences, its
  kept pieces in place, as decode.py --split_sentences does (Translator.translate_texts);
  the flag was ignored (the line one sentence, the emoji given to the model)."""
  import io

  from flax_transformer.cli import interactive

  text = "A dog runs in the park. A cat 😀 sleeps."
  out = tmp_path / "out.de"
  interactive.run_interactive(workdir=str(trained_tiny), output_path=str(out),
                              stdin=io.BytesIO(text.encode() + b"\r\n"),
                              split_sentences=True, search=SEARCH)
  texts = Translator.from_workdir(trained_tiny, search=SEARCH).translate_texts([text], "en")
  assert "😀" in texts[0]
  assert out.read_bytes() == texts[0].encode() + b"\r\n"


def test_interactive_is_the_default_on_a_terminal_and_refuses_batch_flags():
  from flax_transformer.cli import interactive
  from flax_transformer.errors import DataError

  terminal, pipe = type("T", (), {"isatty": lambda self: True})(), \
      type("P", (), {"isatty": lambda self: False})()
  assert interactive.wanted(None, "-", terminal) and not interactive.wanted(None, "-", pipe)
  assert not interactive.wanted(None, "in.en", terminal) and interactive.wanted(True, "-", pipe)
  # --nointeractive, or a batch-only flag, on a terminal (srun --pty, say): the whole input.
  assert not interactive.wanted(False, "-", terminal)
  assert not interactive.wanted(None, "-", terminal, batch_only=["t.de", None])
  with pytest.raises(DataError, match="--interactive translates stdin line by line: drop "
                                      "--reference"):
    interactive.check_flags(**{"--reference": "ref.de", "--prefix": None})


def test_serve_py_names_a_taken_port_or_a_missing_workdir_in_one_line(server, trained_tiny,
                                                                      tmp_path):
  port = server.url.rsplit(":", 1)[1]
  runs = {what: subprocess.Popen([sys.executable, str(ROOT / "serve.py"), *flags],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cpu_env())
          for what, flags in {"port": [f"--workdir={trained_tiny}", f"--port={port}"],
                              "workdir": [f"--workdir={tmp_path / 'none'}", "--port=0"]}.items()}
  stderr = {what: text.decode().strip() for what, text in
            conftest.stderr_of_each(runs, timeout=120).items()}
  assert [runs[what].returncode for what in runs] == [2, 2], stderr
  assert stderr["port"] == f"error: --host 127.0.0.1 --port {port}: the address is in use"
  assert stderr["workdir"].startswith("error: ") and "none" in stderr["workdir"]
  assert all(len(text.splitlines()) == 1 for text in stderr.values()), stderr


@pytest.fixture(scope="module")
def batcher(translator):
  """A Batcher in this process (nothing compiled until it searches)."""
  from flax_transformer.serving.batcher import Batcher

  return Batcher(translator, max_batch=8, max_tokens=64)


def test_the_batcher_shares_the_translators_placed_params(batcher, translator):
  derived = batcher._translator(dataclasses.replace(SEARCH, alpha=1.0), 2, 16)
  base = jax.tree_util.tree_leaves(translator._placed_params)
  for params in (batcher._params, derived._placed_params):
    leaves = jax.tree_util.tree_leaves(params)
    assert len(leaves) == len(base) and all(a is b for a, b in zip(leaves, base))


def test_a_cancelled_request_is_dropped_and_its_batch_mates_answered(translator, expected,
                                                                     caplog):
  """A's caller cancels it (its client hung up: hangup.py; uvicorn's shutdown; any Python
  caller): A is dropped unsearched, and B, gathered in the same batch, is compiled for and
  searched alone, and answered. The batcher gathers exactly A and B (max_batch 2
  sentences, a minute's wait for more): no timing decides. B's two sentences fill a batch
  when they come back from their compile, so nothing waits that minute for company."""
  from flax_transformer.serving.batcher import Batcher

  batcher = Batcher(translator, max_batch=2, max_wait_s=60, max_tokens=16)
  with caplog.at_level(logging.INFO):
    a = batcher.translate([SENTENCES[0]], SEARCH)
    assert a.cancel()
    b = batcher.translate(SENTENCES[1:3], SEARCH)
    assert [hyps[0][0] for hyps in b.result(timeout=300)] == expected[1:3]
  compiles = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling ")]
  assert len(compiles) == 1 and " for 1 request(s), " in compiles[0], compiles  # B's alone.
  assert a.cancelled() and batcher.stats["searches"] == 1 and batcher.stats["cancelled"] == 1
  pairs = [SENTENCES[0]], [expected[0]]
  a = batcher.score(*pairs)
  assert a.cancel()
  b = batcher.score([SENTENCES[1]], [expected[1]])
  assert [s["tokens"] for s in b.result(timeout=300)] == [
      tokens for _, tokens in translator.score([SENTENCES[1]], [expected[1]])]
  assert batcher.stats["searches"] == 2 and batcher.stats["cancelled"] == 2


def test_sentences_waiting_while_others_are_searched_fill_whole_batches(translator):
  """Issue 78: a search costs its rows, filler rows as much as sentences (a small model on
  CPU), and under 64 clients' paragraphs serve.py searched 1.55 rows per sentence where
  decode.py searches a whole file in 1.12 (its batches full, sorted by length). The
  batcher gathers exactly two requests here (max_batch 8 sentences, a minute's wait for
  them): 5 sentences of width 32, then 3 of width 16. While the 16s wait, the 32s go
  as a full [4, 32], then their oldest-left one in [2, 32] (one filler: fewer than the
  devices); the 16s, alone, in [4, 16]: 10 rows for 8 sentences (at 6a64c1b, 16: each
  group padded up to the ladder's 8). Each request's answers equal the Translator's."""
  from flax_transformer.serving.batcher import Batcher

  batcher = Batcher(translator, max_batch=8, max_wait_s=60, max_tokens=32)
  batcher.warm()
  short = [s for s in SENTENCES if s][:3]
  pairs = (f"{a} {b}" for a in short + SENTENCES[3:5] for b in SENTENCES if a != b and b)
  long = [pair for pair in pairs if batcher.width(pair) == 32][:5]
  assert len(long) == 5 and [batcher.width(s) for s in short] == [16] * 3
  before = dict(batcher.stats)
  futures = [batcher.translate(long, SEARCH), batcher.translate(short, SEARCH)]
  found = [[hyps[0][0] for hyps in future.result(timeout=300)] for future in futures]
  assert found == [translator.translate(long), translator.translate(short)]
  searched = {key: batcher.stats[key] - before[key] for key in ("searches", "rows")}
  assert searched == {"searches": 3, "rows": 10}, searched


def _asgi(app, method: str, path: str, data: bytes = b"{}", headers=()) -> tuple[int, bytes]:
  """(status, body) of `method` `path` with `data` as a JSON body, sent to the ASGI `app` in
  this process, its connection open until the answer (as an ASGI server's receive: blocks
  once the body is in)."""
  import asyncio

  sent, calls = [], []

  async def receive():
    if calls:
      await asyncio.Event().wait()
    calls.append(1)
    return {"type": "http.request", "body": data, "more_body": False}

  async def send(message):
    sent.append(message)

  scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
           "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
           "root_path": "", "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(data)).encode()),
                                        *headers],
           "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
  asyncio.run(app(scope, receive, send))
  status = next(m["status"] for m in sent if m["type"] == "http.response.start")
  return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _post(app, path: str, body: dict) -> tuple[int, dict]:
  """(status, JSON answer) of POST `body` (JSON) to the ASGI `app` in this process."""
  status, answer = _asgi(app, "POST", path, json.dumps(body).encode())
  return status, json.loads(answer)


def test_health_gives_an_imported_models_vocabulary_size_not_its_padded_rows(tmp_path):
  """An import pads the vocabulary for sharding (pretrained/vocab_padding.py: the fixture's
  511 ids to 512 rows, the added ones never produced): /health's vocab_size is the
  vocabulary's, as transformers' config.json gives it."""
  from flax_transformer.pretrained import importer
  from flax_transformer.serving.app import make_app
  from flax_transformer.serving.batcher import Batcher

  folder = ROOT / "tests/fixtures/marian_swish_shared"
  importer.import_model(folder, tmp_path / "run")
  translator = Translator.from_workdir(tmp_path / "run", search=SEARCH, batch_tokens=128,
                                       devices=jax.devices()[:1])
  assert translator.model_config.vocab_size == 512  # The padded rows.
  app = make_app(translator, Batcher(translator, max_batch=8, max_tokens=64), workdir="wd")
  status, answer = _asgi(app, "GET", "/health")
  assert status == 200
  assert json.loads(answer)["model"]["vocab_size"] == json.loads(
      (folder / "config.json").read_text())["vocab_size"] == 511


def test_a_request_whose_search_no_memory_holds_is_a_422_line(translator, batcher):
  """A server whose --max_beam lets a request ask for a beam of 10^5 (10^8): its option
  set's largest batch, [8, 64] on 2 devices, is refused by the memory estimate (the
  int32 bound) in one line, before anything compiles; wrong types by the schema."""
  from flax_transformer.serving.app import Limits, make_app

  app = make_app(translator, batcher, workdir="wd", limits=Limits(max_beam=10**9))
  families = list(batcher._families)
  for options, words in [
      ({"beam_size": 100_000}, "beam_size=100000: a search of 4 sentence(s) x 64 tokens"),
      ({"beam_size": 10**8}, "beam_size=100000000 x the vocabulary's"),
      ({"beam_size": 2.5}, "field 'beam_size': Input should be a valid integer"),
      ({"beam_size": True}, "field 'beam_size': Input should be a valid integer"),
      ({"alpha": True}, "field 'alpha': Input should be a valid number")]:
    status, answer = _post(app, "/translate", {"text": ["A dog."], **options})
    assert status == 422 and answer["error"].startswith(words), (options, answer)
  assert list(batcher._families) == families  # No option set made, nothing compiled.


def _sent_then_hung_up(server, body: dict) -> socket.socket:
  """A client that sent POST /translate `body` whole and reads nothing: close the socket
  and it has hung up (curl -m 1)."""
  url = urllib.parse.urlsplit(server.url)
  data = json.dumps(body).encode()
  client = socket.create_connection((url.hostname, url.port))
  client.sendall(f"POST /translate HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer "
                 f"{TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
                 "\r\n\r\n".encode() + data)
  return client


def test_clients_that_hang_up_before_their_compile_cost_no_compile(server):
  """Six requests with new alphas, whose clients hang up while the first one's option set
  compiles (the search thread hands each to the compile thread at once): the five
  queued behind it are not compiled, none is searched, and a live request with a new
  alpha waits for one compile at most, not six (issue 74: 45 s behind 11 compiles for
  nobody). Counted in compiles, not seconds."""
  programs = r"Beam search for inputs \[\d+, \d+\] (compiled|loaded)"
  start, before = len(server.log.read_text()), server.stats()
  alphas = [1.1, 1.2, 1.3, 1.4, 1.5, 1.6]  # No other test asks for these.
  clients = [_sent_then_hung_up(server, {"text": [SENTENCES[0]], "alpha": a}) for a in alphas]
  deadline = time.time() + 60
  while not all(f"alpha={a}, " in server.log.read_text()[start:] for a in alphas):
    assert time.time() < deadline, server.log.read_text()[start:][-3000:]
    time.sleep(0.02)
  for client in clients:
    client.close()
  while server.stats()["cancelled"] - before["cancelled"] < len(alphas):  # All dropped.
    assert time.time() < deadline + 120, (server.stats(), server.log.read_text()[start:][-3000:])
    time.sleep(0.05)
  status, answer = server.call("/translate", {"text": [SENTENCES[0]], "alpha": 1.7})
  assert status == 200 and answer["alpha"] == 1.7 and answer["translations"][0]
  log = server.log.read_text()[start:]
  skipped = re.findall(r"Skipped compiling SearchConfig\(beam_size=4, alpha=(1\.\d)", log)
  assert len(skipped) >= len(alphas) - 1 and set(skipped) <= {str(a) for a in alphas}, log
  assert len(re.findall(programs, log)) <= 2, log  # The first dead one's, and the live one's.
  assert log.count("client disconnected before its answer; cancelled") == len(alphas), log
  after = server.stats()
  assert after["searches"] - before["searches"] == 1, (before, after)  # The live one's.


def test_more_option_sets_than_max_configs_compile_once_each_and_are_all_answered(
    translator, caplog):
  """max_configs 2 and three option sets at once: a set is not dropped while its requests
  wait for their compile (dropped, they compiled again: 6 compiles for 3 requests at
  726c415), and the set over the cap is kept until its request is answered."""
  from flax_transformer.serving.batcher import Batcher

  batcher = Batcher(translator, max_batch=8, max_wait_s=1, max_tokens=16, max_configs=2)
  searches = [dataclasses.replace(SEARCH, beam_size=beam) for beam in (2, 3, 5)]
  with caplog.at_level(logging.INFO):
    futures = [batcher.translate([SENTENCES[i]], s) for i, s in enumerate(searches)]
    found = [future.result(timeout=600) for future in futures]
    compiles = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling ")]
  assert len(compiles) == 3 and all(f"beam_size={s.beam_size}," in " ".join(compiles)
                                    for s in searches), compiles
  assert [[len(h) for h in hyps] for hyps in found] == [[1]] * 3
  assert all(hyps[0][0][0] for hyps in found), found
  assert len(batcher._families) == 3  # Over the cap while all three waited; none idle since.
  batcher.translate([SENTENCES[0]], SEARCH).result(timeout=600)
  assert len(batcher._families) == 2  # The next set drops the idle ones down to the cap.


def test_a_forced_prefix_is_routed_at_its_length_without_eos(batcher):
  prefixes = {batcher.prefix_length(" ".join(["a"] * n)): " ".join(["a"] * n)
              for n in range(1, 40)}
  assert len(batcher.tokenizer.tokenize(prefixes[16])) == 17  # Its EOS: never forced.
  assert batcher.width("A dog.", prefixes[16]) == 16
  assert batcher.width("A dog.", prefixes[17]) == 32
  assert batcher.width("A dog.", "") == batcher.width("A dog.") == 16


LIBRETRANSLATE_BAD = [  # (what, fields, status, the one-line error)
    ("source not the pair's", dict(q="A dog.", source="fr", target="de"), 400,
     "fr is not supported as source: this server translates en to de (GET /languages)"),
    ("target not the pair's", dict(q="A dog.", source="en", target="fr"), 400,
     "fr is not supported as target: this server translates en to de (GET /languages)"),
    ("xml", dict(q="<p>A dog.</p>", source="en", target="de", format="xml"), 400,
     "'xml' format is not supported (formats: text, html)"),
    ("no q", dict(source="en", target="de"), 400, "Invalid request: missing q parameter"),
    ("no target", dict(q="A dog.", source="en"), 400, "Invalid request: missing target parameter"),
    ("bad api_key", dict(q="A dog.", source="en", target="de", api_key="guess"), 403,
     "Invalid API key"),
    ("no api_key", dict(q="A dog.", source="en", target="de", api_key=""), 403,
     "missing api_key: this server needs its token as api_key"),
]


def test_a_libretranslate_client_gets_the_translators_answers(server, expected):
  """The real libretranslatepy client (a form POST /translate with api_key, GET
  /languages) against serve.py: the pair the workdir was trained on, and the
  Translator's translations, batched with serve.py's own requests."""
  from libretranslatepy import LibreTranslateAPI

  client = LibreTranslateAPI(server.url, api_key=TOKEN)
  assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]},
                                {"code": "de", "name": "German", "targets": []}]
  assert [client.translate(s, "en", "de") for s in SENTENCES[:2]] == expected[:2]
  assert client.translate(SENTENCES[2], "auto", "de") == expected[2]
  # q as a list (JSON, LibreTranslate's batch form): a list back, in order.
  assert server.call("/translate", {"q": SENTENCES, "source": "en", "target": "de",
                                    "api_key": TOKEN}, token=None
                     ) == (200, {"translatedText": expected})
  for what, fields, status, error in LIBRETRANSLATE_BAD:
    form = urllib.parse.urlencode({"api_key": TOKEN, **fields}).encode()
    got = server.call("/translate", raw=form, token=None)
    assert got == (status, {"error": error}), what
  assert server.call("/languages", token=None)[0] == 200  # Open, as LibreTranslate's.
  log = server.log.read_text()
  assert all(any(f"{status} POST /translate" in line and error in line
                 for line in log.splitlines()) for _, _, status, error in LIBRETRANSLATE_BAD)


def _http(server, method: str, path: str, body: bytes = b"", headers: dict | None = None
          ) -> tuple[int, dict, dict]:
  """(status, headers, JSON answer, or the text of another) of one request sent as given."""
  connection = http.client.HTTPConnection(*server.url.removeprefix("http://").split(":"),
                                          timeout=120)
  try:
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    try:
      answer = json.loads(data)
    except ValueError:  # A preflight's "OK".
      answer = data.decode()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, answer
  finally:
    connection.close()


def test_libretranslate_cors_multipart_query_strings_auto_and_what_it_refuses(server, expected):
  """What browser extensions and other LibreTranslate clients send besides
  libretranslatepy's form (each refused or unanswered at 8795e60)."""
  origin = {"Origin": "https://example.org"}
  preflight = _http(server, "OPTIONS", "/translate", headers={
      **origin, "Access-Control-Request-Method": "POST",
      "Access-Control-Request-Headers": "content-type"})
  assert preflight[0] == 200 and preflight[1]["access-control-allow-origin"] == "*", preflight
  assert "POST" in preflight[1]["access-control-allow-methods"]
  got = _http(server, "GET", "/languages", headers=origin)
  assert got[1]["access-control-allow-origin"] == "*"
  assert "access-control-allow-origin" not in _http(server, "GET", "/health", headers={
      **origin, "Authorization": f"Bearer {TOKEN}"})[1]  # serve.py's own: same-origin.
  fields = {"q": SENTENCES[0], "source": "en", "target": "de", "api_key": TOKEN}
  boundary = "b0undary"
  multipart = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n'
                      f"{v}\r\n" for k, v in fields.items()) + f"--{boundary}--\r\n"
  got = _http(server, "POST", "/translate", multipart.encode(), {
      **origin, "Content-Type": f"multipart/form-data; boundary={boundary}"})
  assert (got[0], got[2]) == (200, {"translatedText": expected[0]})
  assert got[1]["access-control-allow-origin"] == "*"
  query = "/translate?" + urllib.parse.urlencode(fields)
  assert _http(server, "POST", query)[::2] == (200, {"translatedText": expected[0]})
  # A field given twice: its first value, the query's before the form's; format null or
  # empty is text (LibreTranslate's request.values.get and its "if not text_format").
  assert server.call("/translate", {**fields, "format": None}, token=None)[0] == 200
  twice = urllib.parse.urlencode([("q", SENTENCES[1]), ("q", SENTENCES[2]), ("format", ""),
                                  *[(k, v) for k, v in fields.items() if k != "q"]])
  assert _http(server, "POST", "/translate?" + urllib.parse.urlencode({"q": SENTENCES[0]}),
               twice.encode())[::2] == (200, {"translatedText": expected[0]})
  assert _http(server, "POST", "/translate", twice.encode())[::2] == (
      200, {"translatedText": expected[1]})
  # A text of several lines (a paragraph each, as browser extensions send): one input per
  # line, the newlines and blank lines back as they came (at 1d04351: one input).
  lines = f"{SENTENCES[0]}\n\n{SENTENCES[1]}\r\n"
  assert server.call("/translate", {**fields, "q": [lines, " "]}, token=None) == (
      200, {"translatedText": [f"{expected[0]}\n\n{expected[1]}\r\n", " "]})
  # Lone surrogates (valid JSON, not text) in the echoed fields and the key: one line, no 500.
  surrogate = '{"q": "A.", "source": "\\ud800", "target": "de", "api_key": "%s"}'
  assert server.call("/translate", raw=(surrogate % TOKEN).encode(), token=None) == (
      400, {"error": "Invalid request: source is not a language code"})
  assert server.call("/translate", raw=(surrogate.replace('\\ud800", "target', 'en", "target')
                                        % "\\udfff").encode(), token=None) == (
      403, {"error": "Invalid API key"})
  detected = {"confidence": 100, "language": "en"}  # Not detected: the pair's source.
  auto = {**fields, "source": "auto"}
  assert server.call("/translate", auto, token=None) == (
      200, {"translatedText": expected[0], "detectedLanguage": detected})
  assert server.call("/translate", {**auto, "q": SENTENCES[:2]}, token=None) == (
      200, {"translatedText": expected[:2], "detectedLanguage": [detected] * 2})
  for what, body, status, error in [
      ("q empty list", {**fields, "q": []}, 400, "Invalid request: missing q parameter"),
      ("alternatives", {**fields, "alternatives": "3 please"}, 400,
       "Invalid request: alternatives parameter is not a number")]:
    assert server.call("/translate", body, token=None) == (status, {"error": error}), what
  # /detect of a one-source model: that source (its api_key checked, as LibreTranslate's).
  assert _http(server, "POST", "/detect", f"q=Hallo&api_key={TOKEN}".encode())[::2] == (
      200, [{"confidence": 100.0, "language": "en"}])
  assert _http(server, "POST", "/detect", b"q=Hallo")[::2] == (403, {
      "error": "missing api_key: this server needs its token as api_key"})
  # A token outside the body is checked before the body is read: no 408 after 2 s of
  # waiting for 400 bytes never sent (at 8795e60 the body was read first).
  for credential, status in [({"Authorization": "Bearer guess"}, 401), ({}, 403)]:
    path = "/translate" if credential else "/translate?api_key=guess"
    sock = socket.create_connection(server.url.removeprefix("http://").split(":"))
    head = "".join(f"{k}: {v}\r\n" for k, v in {**credential, "Content-Length": 400}.items())
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode())
    sock.settimeout(30)
    reply = http.client.HTTPResponse(sock)
    reply.begin()
    assert reply.status == status, (credential, reply.status, reply.read())
    sock.close()


def test_the_language_pair_of_a_trained_an_imported_and_a_bare_workdir(trained_tiny, tmp_path):
  from flax_transformer import workdir

  assert workdir.language_pair(trained_tiny) == ("en", "de")
  (tmp_path / "run.json").write_text(json.dumps(
      {"model": {}, "launches": [], "tokenizer": {"kind": "fsmt", "langs": ["ru", "en"]}}))
  assert workdir.language_pair(tmp_path) == ("ru", "en")
  (tmp_path / "run.json").write_text(json.dumps({"model": {}, "launches": [],
                                                 "tokenizer": {"kind": "marian"}}))
  assert workdir.language_pair(tmp_path) is None


def test_a_handler_cut_off_at_shutdown_answers_a_one_line_json_503(caplog):
  """uvicorn cancels the handlers left when the drain time ends: each answers a JSON 503
  and is counted, with no traceback (at 726c415: a plain-text 500 and one traceback each)."""
  import asyncio

  from flax_transformer.serving.drain import Drain, Gate

  async def compiling(scope, receive, send):
    await asyncio.sleep(60)

  sent, drain = [], Drain()

  async def send(message):
    sent.append(message)

  async def shut_down():
    task = asyncio.ensure_future(Gate(compiling, drain)({"type": "http", "headers": []}, None,
                                                         send))
    await asyncio.sleep(0.01)
    drain.start(0.0, "SIGTERM")
    task.cancel()
    await task  # Not cancelled: the gate answered.

  asyncio.run(shut_down())
  assert sent[0]["status"] == 503 and json.loads(sent[1]["body"]) == {
      "error": "the server shut down before this request was answered (serve.py --drain_s)"}
  assert (drain.at_start, drain.cut, drain.in_flight) == (1, 1, 0)
  assert drain.summary() == ("Shut down on SIGTERM: drained 0 of the 1 request(s) in flight, "
                             "refused 0 new one(s) with 503, cut off 1 at the 0 s drain time")


def test_sigterm_during_a_compile_answers_the_accepted_requests_and_503s_new_ones(server):
  """Last in the module: it stops the module's server. Two requests whose option sets
  compile one after the other (one compile thread) are answered after a SIGTERM sent
  during the first compile; a new request meanwhile gets a JSON 503 (at 726c415: a
  refused connection), and one log line counts them."""
  compiling = lambda: server.log.read_text().count("other requests are served meanwhile")  # noqa: E731
  before = compiling()
  # Options no other test asks for: not in the session's compilation cache.
  bodies = [{"text": [SENTENCES[0]], "beam_size": beam, "alpha": 3.3} for beam in (6, 7)]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    accepted = [pool.submit(server.call, "/translate", body) for body in bodies]
    deadline = time.time() + 120  # Until both are handed to the compile thread.
    while compiling() < before + 2:
      assert time.time() < deadline and not any(a.done() for a in accepted), \
          server.log.read_text()[-3000:]
      time.sleep(0.02)
    server.process.send_signal(signal.SIGTERM)
    while "SIGTERM: answering the" not in server.log.read_text():
      assert time.time() < deadline, server.log.read_text()[-3000:]
      time.sleep(0.02)
    refused = server.call("/translate", {"text": [SENTENCES[1]]})  # The compiles go on.
    answers = [a.result(timeout=300) for a in accepted]
  assert [(status, len(answer["translations"])) for status, answer in answers] == [(200, 1)] * 2
  assert refused == (503, {"error": "the server is shutting down: send this request to another "
                                    "server, or again later"})
  assert server.process.wait(timeout=60) == 0  # A clean drain (at 8795e60: 143, the signal).
  log = server.log.read_text()
  assert "SIGTERM: answering the 2 request(s) in flight" in log
  assert [line for line in log.splitlines() if "Shut down on SIGTERM" in line][0].endswith(
      "drained 2 of the 2 request(s) in flight, refused 1 new one(s) with 503, cut off 0 at "
      "the 25 s drain time"), log[-3000:]
  assert "Traceback" not in log


def test_every_route_without_the_token_is_refused_but_libretranslates_open_ones(translator,
                                                                               batcher):
  """The token is one dependency of the whole app: every route, one added after the app
  was made too, answers 401 without it; only OPEN_ROUTES (open as LibreTranslate's)
  answer, and BODY_KEY_ROUTES (LibreTranslate's api_key may come in the body) refuse
  once the body is read."""
  from fastapi.routing import APIRoute

  from flax_transformer.serving.app import BODY_KEY_ROUTES, OPEN_ROUTES, make_app

  app = make_app(translator, batcher, workdir="wd", token=TOKEN)

  @app.get("/added_later")
  async def added_later():
    return {"ok": True}

  routes = [(method, route.path) for route in app.routes if isinstance(route, APIRoute)
            for method in route.methods]
  assert {path for _, path in routes} >= (OPEN_ROUTES | BODY_KEY_ROUTES
                                          | {"/health", "/score", "/added_later"})
  for method, path in routes:
    status = _asgi(app, method, path)[0]
    if path in OPEN_ROUTES:
      assert status == 200, (method, path, status)
    elif path in BODY_KEY_ROUTES:
      assert 400 <= status < 500, (method, path, status)
    else:
      assert status == 401, (method, path, status)
  assert _asgi(app, "GET", "/added_later", headers=[(b"authorization",
                                                    f"Bearer {TOKEN}".encode())])[0] == 200


def test_serve_py_languages_must_be_a_pair_the_workdirs_model_translates(tmp_path):
  """--languages on a workdir whose run.json states its languages: a pair the model does
  not translate is one line and exit 2 before anything is loaded (at 3e19ea3 the server
  started, listed fr -> it and answered every request with a 500)."""
  from flax_transformer.languages import Languages

  (tmp_path / "run.json").write_text(json.dumps(
      {"languages": Languages.trained(["en", "de", "fr"]).to_json()}))
  done = subprocess.run([sys.executable, str(ROOT / "serve.py"), f"--workdir={tmp_path}",
                         "--languages=fr,it"], capture_output=True, text=True, env=cpu_env(),
                        timeout=120)
  assert (done.returncode, done.stderr.strip()) == (
      2, "error: --languages=fr,it: the model does not translate into 'it': it knows "
         "en -> de, fr; de -> en, fr; fr -> en, de")
