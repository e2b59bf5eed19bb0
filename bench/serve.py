"""serve.py under load: N concurrent clients sending Multi30k test 2016, one sentence per request.

python bench/serve.py --workdir=DIR [--clients 1,8,64] [--json results/bench/serve.json]

First the whole file through `Translator.translate` in this process, as decode.py runs it,
timed after a compiling pass and again after each load run (each run compared with the
mean of the passes around it); its output is the answer every request must get. Then
serve.py on the same devices, per client count: sentences/s, p50/p99 request latency,
answers equal to the Translator's, the server's searches and RSS (sampled every 0.2 s).
The aim (issue 60): at 64 clients, >= 70% of the whole-file throughput.

--option_sets N (issue 68): N requests one after another, each with an alpha no other
sends, to a serve.py with a fresh compilation cache (capped by --cache_max_mb); after
each, the server's RSS and the cache's bytes (--json default results/bench/serve_option_sets.json).

--hangups N (issue 74): one server, two phases side by side: --clients live clients
sending the sentences (the server's default search) while a probe sends requests with
option sets of their own one after another (each a compile), first alone, then with N
more clients that each send a request with a new option set and hang up after
--hangup_s without reading (curl -m 1), again and again. Per phase: the live requests'
p50/p99, the probe's latencies, the compiles run and skipped, the requests cancelled
(--json default results/bench/serve_hangups.json).
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import MULTI30K, ROOT, TreeSampler, bench_command, machine, parser, print_table, \
    tree_memory, write_json

AIM_CLIENTS, AIM_FRACTION = 64, 0.7


class Client:
  """One keep-alive HTTP connection to the server."""

  def __init__(self, port: int):
    self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

  def call(self, method: str, path: str, body=None) -> tuple[int, dict]:
    self.connection.request(method, path, body=None if body is None else json.dumps(body),
                            headers={"Content-Type": "application/json"})
    response = self.connection.getresponse()
    return response.status, json.loads(response.read())


def load(port: int, pid: int, sentences: list[str], clients: int) -> dict:
  """`clients` threads, each sending the next unsent sentence until none is left."""
  todo: queue.Queue[int] = queue.Queue()
  for i in range(len(sentences)):
    todo.put(i)
  answers: list[str | None] = [None] * len(sentences)
  latencies: list[float] = []
  errors: list[str] = []

  def client():
    connection = Client(port)
    while True:
      try:
        i = todo.get_nowait()
      except queue.Empty:
        return
      start = time.perf_counter()
      status, answer = connection.call("POST", "/translate", {"text": [sentences[i]]})
      latencies.append(time.perf_counter() - start)
      if status != 200:
        errors.append(f"{status} {answer}")
      else:
        answers[i] = answer["translations"][0]

  before = Client(port).call("GET", "/health")[1]["batching"]
  sampler = TreeSampler(pid, every_s=0.2)
  threads = [threading.Thread(target=client) for _ in range(clients)]
  start = time.perf_counter()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  wall = time.perf_counter() - start
  rss = [tree["main"]["rss"] for tree in sampler.stop() if "main" in tree]  # The server's, MiB.
  after = Client(port).call("GET", "/health")[1]["batching"]
  latencies.sort()
  at = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
  searches = after["searches"] - before["searches"]
  return {"clients": clients, "sentences": len(sentences), "wall_s": wall,
          "sentences_per_s": len(sentences) / wall, "p50_ms": 1000 * at(0.5),
          "p99_ms": 1000 * at(0.99), "searches": searches,
          "sentences_per_search": len(sentences) / max(1, searches), "errors": errors[:5],
          "error_count": len(errors), "answers": answers, "rss_mb_start": rss[0],
          "rss_mb_end": rss[-1], "rss_mb_max": max(rss), "rss_samples": len(rss)}


def start(command: list[str], log_path: Path, port: int) -> tuple[subprocess.Popen, float]:
  """serve.py started with `command`, its output in `log_path`; returns it once /health
  answers, and the seconds that took."""
  started = time.perf_counter()
  log_path.parent.mkdir(parents=True, exist_ok=True)
  with open(log_path, "w") as log:
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "XLA_FLAGS": ""})
  while True:
    try:
      if Client(port).call("GET", "/health")[0] == 200:
        return server, time.perf_counter() - started
    except OSError:
      pass
    if server.poll() is not None:
      raise SystemExit(f"serve.py exited ({server.returncode}); see {log_path}")
    time.sleep(0.5)


def option_sets(args) -> None:
  """--option_sets: the server's RSS and its compilation cache's bytes over N requests,
  each with its own alpha (issue 68: both grew with every new option set)."""
  import tempfile

  from flax_transformer import compilation, provenance

  cache = tempfile.mkdtemp(prefix="serve_option_sets_xla_")
  command = [sys.executable, str(ROOT / "serve.py"), f"--workdir={args.workdir}",
             f"--port={args.port}", f"--cpu_devices={args.cpu_devices}",
             f"--max_configs={args.max_configs}", f"--compilation_cache_dir={cache}",
             f"--compilation_cache_max_mb={args.cache_max_mb}", "--max_tokens=16",
             "--max_batch=8"]
  code = provenance.commit()  # Before the run writes its log beside the JSON.
  log_path = Path(args.json).with_suffix(".log")
  server, ready_s = start(command, log_path, args.port)
  rows, client, errors = [], Client(args.port), []
  try:
    for i in range(args.option_sets):
      alpha = 10 * i / args.option_sets  # Distinct: 0, 0.02, ... (N = 500).
      start_s = time.perf_counter()
      status, answer = client.call("POST", "/translate", {"text": ["A dog runs."],
                                                          "alpha": alpha})
      if status != 200:
        errors.append(f"{status} {answer}")
      rss = tree_memory(server.pid)["main"]["rss"]
      rows.append({"request": i, "alpha": alpha, "seconds": time.perf_counter() - start_s,
                   "rss_mb": rss, "cache_bytes": compilation.cache_bytes(cache)})
      if i % 50 == 0:
        print(f"{i}: alpha {alpha:.2f}, RSS {rss:.0f} MiB, cache "
              f"{rows[-1]['cache_bytes'] / 2**20:.1f} MiB", flush=True)
    health = client.call("GET", "/health")[1]
  finally:
    server.terminate()
    server.wait(timeout=60)
  log = log_path.read_text()
  quarter = len(rows) // 4
  summary = {key: {"first_quarter_mean": sum(r[key] for r in rows[:quarter]) / quarter,
                   "last_quarter_mean": sum(r[key] for r in rows[-quarter:]) / quarter,
                   "max": max(r[key] for r in rows), "last": rows[-1][key]}
             for key in ("rss_mb", "cache_bytes")}
  record = {"command": bench_command(), "serve_command": " ".join(["python", "serve.py",
                                                                    *command[2:]]),
            "requests": len(rows), "errors": errors[:5], "error_count": len(errors),
            "compiles": log.count("Compiling SearchConfig"),
            "dropped": log.count("Dropped the compiled searches"),
            "cache_entries_end": len(list(Path(cache).rglob("*-cache"))),
            "server_ready_s": ready_s,
            "summary": summary, "batching": health["batching"], "rows": rows,
            **code, "packages": provenance.package_versions(),
            "machine": machine()}
  print(json.dumps({k: record[k] for k in ("requests", "error_count", "compiles", "dropped",
                                           "cache_entries_end", "summary")}, indent=1))
  write_json(args.json, record)


class OptionSets:
  """Distinct (beam_size, alpha) pairs on serve.py's 0.1 grid from `beams`, not the default's."""

  def __init__(self, beams: tuple[int, ...]):
    self.pairs = iter([(beam, round(0.1 * k, 1)) for k in range(101) for beam in beams
                       if (beam, round(0.1 * k, 1)) != (4, 0.6)])
    self.lock = threading.Lock()

  def next(self) -> dict:
    with self.lock:
      beam, alpha = next(self.pairs)
    return {"beam_size": beam, "alpha": alpha}


def hang_up_client(port: int, sets: OptionSets, sentence: str, hangup_s: float,
                   stop: threading.Event, counts: dict) -> None:
  """Sends a request with a new option set, waits `hangup_s` for nothing, closes; again."""
  while not stop.is_set():
    data = json.dumps({"text": [sentence], **sets.next()}).encode()
    with socket.create_connection(("127.0.0.1", port)) as connection:
      connection.sendall(b"POST /translate HTTP/1.1\r\nHost: bench\r\nContent-Type: "
                         b"application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
      connection.settimeout(hangup_s)
      try:
        answered = bool(connection.recv(1))
      except socket.timeout:
        answered = False
    counts["answered" if answered else "hung_up"] += 1


def probe(port: int, sets: OptionSets, sentence: str, count: int, stop: threading.Event,
          seconds: list[float]) -> None:
  """A live client: `count` requests one after another, each a new option set; then stop."""
  client = Client(port)
  for _ in range(count):
    start_s = time.perf_counter()
    status, _ = client.call("POST", "/translate", {"text": [sentence], **sets.next()})
    if status == 200:
      seconds.append(time.perf_counter() - start_s)
  stop.set()


def live_client(port: int, sentences: list[str], first: int, step: int, stop: threading.Event,
                seconds: list[float], errors: list[str]) -> None:
  """Sentences first, first + step, ... (cycling), the server's default search, until stop."""
  client, i = Client(port), first
  while not stop.is_set():
    start_s = time.perf_counter()
    status, answer = client.call("POST", "/translate", {"text": [sentences[i % len(sentences)]]})
    seconds.append(time.perf_counter() - start_s)
    if status != 200:
      errors.append(f"{status} {answer}")
    i += step


def hangup_phase(args, sentences: list[str], hangups: int, sets: dict) -> dict:
  """The live clients and the probe, with `hangups` clients hanging up, until the probe ends."""
  log_path, clients = Path(args.json).with_suffix(".log"), int(args.clients.split(",")[0])
  start = len(log_path.read_text())
  stop, counts, probed, live, errors = threading.Event(), {"hung_up": 0, "answered": 0}, [], [], []
  threads = [threading.Thread(target=probe, args=(args.port, sets["probe"], sentences[0],
                                                  args.probes, stop, probed))]
  threads += [threading.Thread(target=live_client, args=(args.port, sentences, i, clients, stop,
                                                         live, errors)) for i in range(clients)]
  threads += [threading.Thread(target=hang_up_client, args=(
      args.port, sets["dead"], sentences[i % len(sentences)], args.hangup_s, stop, counts))
              for i in range(hangups)]
  before = Client(args.port).call("GET", "/health")[1]["batching"]
  started = time.perf_counter()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  wall = time.perf_counter() - started
  time.sleep(1.0)  # The last hang-ups' compiles skipped or run, their requests dropped.
  after = Client(args.port).call("GET", "/health")[1]["batching"]
  log = log_path.read_text()[start:]
  live.sort()
  at = lambda q: 1000 * live[min(len(live) - 1, int(q * len(live)))]  # noqa: E731
  return {"hangup_clients": hangups, "clients": clients, "wall_s": wall,
          "live_requests": len(live), "p50_ms": at(0.5), "p99_ms": at(0.99),
          "max_ms": 1000 * live[-1], "error_count": len(errors), "errors": errors[:5],
          "probe_s": probed, "probe_max_s": max(probed, default=None),
          "hangup_requests": counts["hung_up"], "answered_before_hangup": counts["answered"],
          "compiles_handed": log.count("Compiling SearchConfig"),
          "compiles_skipped": log.count("Skipped compiling"),
          "programs_compiled": log.count("Beam search for inputs"),
          "cancelled": after.get("cancelled", 0) - before.get("cancelled", 0),
          "searches": after["searches"] - before["searches"],
          "disconnect_lines": log.count("client disconnected before its answer")}


def hangups(args) -> None:
  """--hangups: live requests' latency without and with clients that hang up (issue 74)."""
  from flax_transformer import provenance
  from flax_transformer.data.sources import read_lines

  sentences = read_lines(MULTI30K / "test_2016_flickr.en.gz")[:args.sentences]
  command = [sys.executable, str(ROOT / "serve.py"), f"--workdir={args.workdir}",
             f"--port={args.port}", f"--cpu_devices={args.cpu_devices}", "--max_tokens=64",
             "--max_batch=8", f"--max_wait_ms={args.max_wait_ms}",
             f"--compilation_cache_dir={args.compilation_cache_dir}"]
  code = provenance.commit()  # Before the run writes its log beside the JSON.
  server, ready_s = start(command, Path(args.json).with_suffix(".log"), args.port)
  sets = {"probe": OptionSets((3,)), "dead": OptionSets((2, 5, 6, 7, 8))}
  try:
    rows = [hangup_phase(args, sentences, n, sets) for n in (0, args.hangups)]
  finally:
    server.terminate()
    server.wait(timeout=60)
  print_table(rows, ["hangup_clients", "clients", "wall_s", "live_requests", "p50_ms", "p99_ms",
                     "max_ms", "probe_max_s", "hangup_requests", "compiles_handed",
                     "compiles_skipped", "programs_compiled", "cancelled", "error_count"])
  record = {"command": bench_command(),
            "serve_command": " ".join(["python", "serve.py", *command[2:]]),
            "hangup_s": args.hangup_s, "server_ready_s": ready_s, "rows": rows,
            "p99_ratio_with_hangups": rows[1]["p99_ms"] / rows[0]["p99_ms"],
            **code, "packages": provenance.package_versions(), "machine": machine()}
  write_json(args.json, record)


def main():
  flags = parser(__doc__)
  flags.set_defaults(json=str(ROOT / "results/bench/serve.json"))
  flags.add_argument("--workdir", required=True, help="a trained Multi30k EN->DE workdir")
  flags.add_argument("--clients", default="1,8,64", help="concurrent clients, comma-separated")
  flags.add_argument("--sentences", type=int, default=1000, help="first N of test 2016")
  flags.add_argument("--port", type=int, default=18080)
  flags.add_argument("--cpu_devices", type=int, default=0, help="as decode.py (0 = per core)")
  flags.add_argument("--max_wait_ms", type=float, default=5.0, help="serve.py's flag")
  flags.add_argument("--max_batch", type=int, default=64, help="serve.py's flag")
  flags.add_argument("--compilation_cache_dir", default="", help="'' = off: every compile shows")
  flags.add_argument("--option_sets", type=int, default=0, help="N requests, each its own alpha")
  flags.add_argument("--max_configs", type=int, default=8, help="serve.py's flag (--option_sets)")
  flags.add_argument("--cache_max_mb", type=int, default=4, help="--option_sets: serve.py's "
                     "--compilation_cache_max_mb")
  flags.add_argument("--hangups", type=int, default=0, help="clients that hang up (issue 74)")
  flags.add_argument("--probes", type=int, default=3, help="--hangups: requests with new "
                     "option sets per phase (each a compile); the phase lasts until they are in")
  flags.add_argument("--hangup_s", type=float, default=1.0, help="--hangups: each waits this "
                     "long for its answer, then closes (curl -m 1)")
  args = flags.parse_args()
  if args.hangups:
    if args.json == str(ROOT / "results/bench/serve.json"):
      args.json = str(ROOT / "results/bench/serve_hangups.json")
    return hangups(args)
  if args.option_sets:
    if args.json == str(ROOT / "results/bench/serve.json"):
      args.json = str(ROOT / "results/bench/serve_option_sets.json")
    return option_sets(args)
  from flax_transformer import provenance
  from flax_transformer.cli import common as cli

  cli.set_cpu_devices(args.cpu_devices)
  from flax_transformer.data.sources import read_lines
  from flax_transformer.translation.translator import Translator

  sentences = read_lines(MULTI30K / "test_2016_flickr.en.gz")[:args.sentences]
  # decode.py's defaults: the last 5 checkpoints averaged, 4096-token batches, beam 4.
  translator = Translator.from_workdir(args.workdir, average_last=5)
  translator.translate(sentences)  # Compiles every batch shape.

  def whole_file() -> tuple[float, list[str]]:
    start = time.perf_counter()
    texts = translator.translate(sentences)
    return time.perf_counter() - start, texts

  before_s, reference = whole_file()
  max_tokens = max(len(translator.tokenizer.tokenize(s)) for s in sentences)
  model = {"workdir": args.workdir, "steps_averaged": translator.checkpoint_steps[0],
           **{k: getattr(translator.model_config, k)
              for k in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "max_len")}}
  command = [sys.executable, str(ROOT / "serve.py"), f"--workdir={args.workdir}",
             f"--port={args.port}", f"--cpu_devices={args.cpu_devices}",
             f"--max_tokens={max_tokens}", f"--max_batch={args.max_batch}",
             f"--max_wait_ms={args.max_wait_ms}", f"--max_sentences={args.max_batch}",
             f"--compilation_cache_dir={args.compilation_cache_dir}"]
  code = provenance.commit()  # Before the run writes its log beside the JSON.
  log_path = Path(args.json).with_suffix(".log")
  server, ready_s = start(command, log_path, args.port)
  try:
    # The machine's load drifts (it is shared): the whole file is timed again after each
    # load run (the server idle meanwhile), and each run is compared with the mean of the
    # passes just before and after it.
    rows, passes_s = [], [before_s]
    for clients in [int(c) for c in args.clients.split(",")]:
      row = load(args.port, server.pid, sentences, clients)
      answers = row.pop("answers")
      row["answers_equal_to_translator"] = sum(a == r for a, r in zip(answers, reference))
      seconds, again = whole_file()
      assert again == reference, "Translator.translate changed its output between passes"
      passes_s.append(seconds)
      row["whole_file_sentences_per_s"] = 2 * len(sentences) / sum(passes_s[-2:])
      row["vs_whole_file"] = row["sentences_per_s"] / row["whole_file_sentences_per_s"]
      rows.append(row)
      print(f"{clients} clients: {row['sentences_per_s']:.1f} sentences/s, "
            f"{row['vs_whole_file']:.2f} of the whole file's", flush=True)
  finally:
    server.terminate()
    server.wait(timeout=60)
  whole = {"sentences": len(sentences), "passes_s": passes_s,
           "sentences_per_s": len(sentences) * len(passes_s) / sum(passes_s),
           "devices": len(translator.devices), "batch_tokens": translator.batch_tokens}
  print_table(rows, ["clients", "sentences", "sentences_per_s", "vs_whole_file", "p50_ms",
                     "p99_ms", "sentences_per_search", "answers_equal_to_translator",
                     "error_count", "rss_mb_start", "rss_mb_max", "rss_mb_end"])
  print(f"decode.py's whole file (Translator.translate): {whole['sentences_per_s']:.1f} "
        f"sentences/s on {whole['devices']} device(s)")
  aim = next((r for r in rows if r["clients"] == AIM_CLIENTS), None)
  record = {"command": bench_command(),
            "serve_command": " ".join(["python", "serve.py", *command[2:]]),
            "server_log": str(log_path.relative_to(ROOT)) if log_path.is_relative_to(ROOT)
            else str(log_path),
            "model": model, "whole_file": whole, "server_ready_s": ready_s, "rows": rows,
            "aim": {"clients": AIM_CLIENTS, "fraction_of_whole_file": AIM_FRACTION,
                    "measured": aim and aim["vs_whole_file"],
                    "met": bool(aim and aim["vs_whole_file"] >= AIM_FRACTION)},
            **code, "packages": provenance.package_versions(),
            "machine": machine()}
  write_json(args.json, record)


if __name__ == "__main__":
  main()
