"""serve.py's LibreTranslate face under load: paragraphs from N clients (issue 78).

python bench/serve_paragraphs.py --workdir=DIR [--clients 64] [--sentences 1000] \\
    [--json results/bench/serve_paragraphs.json]

Multi30k test 2016's first --sentences English captions, grouped into paragraphs of 3-6
consecutive ones (seeded), each joined by a space: what a browser extension or an office
plug-in sends. First the paragraphs' sentences (split as the server splits them,
sentences.py) through `Translator.translate` in this process, as decode.py runs a file of
them, timed after a compiling pass and again after the load run; its translations joined
back are the answer each request must get. Then serve.py (bench/serve.py's start) on the
same devices, --clients threads each sending the next unsent paragraph as LibreTranslate
JSON ({"q", "source", "target"}): sentences/s (model inputs over the wall time), p50/p99
request latency, answers equal to the Translator's, the server's searches and their
rows (filler rows included: rows per sentence, 1 when every search is full), its RSS
(sampled every 0.2 s). The aim (issue 78): >= 0.9 of the whole file's sentences/s. A
sibling of bench/serve.py (which sends one sentence per request to serve.py's own API).
"""

from __future__ import annotations

import importlib.util
import queue
import random
import sys
import threading
import time
from pathlib import Path

from common import MULTI30K, ROOT, TreeSampler, bench_command, machine, parser, write_json

_spec = importlib.util.spec_from_file_location("serve_bench", Path(__file__).with_name("serve.py"))
serve_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_bench)  # Its Client and start: one way to run serve.py.
AIM = 0.9


def paragraphs_of(sentences: list[str], seed: int) -> list[str]:
  rng, out, at = random.Random(seed), [], 0
  while at < len(sentences):
    size = rng.randint(3, 6)
    out.append(" ".join(sentences[at:at + size]))
    at += size
  return out


def load(port: int, pid: int, paragraphs: list[str], clients: int) -> dict:
  """`clients` threads, each sending the next unsent paragraph until none is left."""
  todo: queue.Queue[int] = queue.Queue()
  for i in range(len(paragraphs)):
    todo.put(i)
  answers: list[str | None] = [None] * len(paragraphs)
  latencies, errors = [], []

  def client():
    connection = serve_bench.Client(port)
    while True:
      try:
        i = todo.get_nowait()
      except queue.Empty:
        return
      start = time.perf_counter()
      status, answer = connection.call("POST", "/translate", {
          "q": paragraphs[i], "source": "en", "target": "de"})
      latencies.append(time.perf_counter() - start)
      if status != 200:
        errors.append(f"{status} {answer}")
      else:
        answers[i] = answer["translatedText"]

  before = serve_bench.Client(port).call("GET", "/health")[1]["batching"]
  sampler = TreeSampler(pid, every_s=0.2)
  threads = [threading.Thread(target=client) for _ in range(clients)]
  start = time.perf_counter()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  wall = time.perf_counter() - start
  rss = [tree["main"]["rss"] for tree in sampler.stop() if "main" in tree]
  after = serve_bench.Client(port).call("GET", "/health")[1]["batching"]
  searched = {key: after[key] - before[key] for key in ("sentences", "searches", "rows")}
  latencies.sort()
  at = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
  return {"clients": clients, "paragraphs": len(paragraphs), "wall_s": wall,
          "p50_ms": 1000 * at(0.5), "p99_ms": 1000 * at(0.99), "errors": errors[:5],
          "error_count": len(errors), "answers": answers, "searches": searched["searches"],
          "rows_searched": searched["rows"],  # Filler rows too: sentences / rows, how full.
          "rows_per_sentence": searched["rows"] / max(1, searched["sentences"]),
          "rss_mb_start": rss[0],
          "rss_mb_end": rss[-1], "rss_mb_max": max(rss), "rss_samples": len(rss)}


def main():
  flags = parser(__doc__)
  flags.set_defaults(json=str(ROOT / "results/bench/serve_paragraphs.json"))
  flags.add_argument("--workdir", required=True, help="a trained Multi30k workdir translating EN->DE "
                     "(a multilingual one too)")
  flags.add_argument("--clients", type=int, default=64)
  flags.add_argument("--sentences", type=int, default=1000, help="first N of test 2016")
  flags.add_argument("--seed", type=int, default=0)
  flags.add_argument("--port", type=int, default=18081)
  flags.add_argument("--cpu_devices", type=int, default=0, help="as decode.py (0 = per core)")
  flags.add_argument("--max_batch", type=int, default=64, help="serve.py's flag")
  flags.add_argument("--max_wait_ms", type=float, default=5.0, help="serve.py's flag")
  args = flags.parse_args()
  from flax_transformer import provenance
  from flax_transformer.cli import common as cli

  cli.set_cpu_devices(args.cpu_devices)
  from flax_transformer.data.sources import read_lines
  from flax_transformer.translation import sentences as sentences_lib
  from flax_transformer.translation.translator import Translator

  paragraphs = paragraphs_of(read_lines(MULTI30K / "test_2016_flickr.en.gz")[:args.sentences],
                             args.seed)
  translator = Translator.from_workdir(args.workdir, average_last=5)  # decode.py's defaults.
  length = lambda s: len(translator.tokenizer.source.tokenize(s))  # noqa: E731
  max_tokens = 64  # serve.py's default --max_tokens, as a user starts it.
  inputs, layouts = sentences_lib.layout(paragraphs, "en", max_tokens, length)
  direction = dict(source_lang="en", target_lang="de")  # One of a multilingual model's too.
  translator.translate(inputs, **direction)  # Compiles every batch shape.

  def whole_file() -> tuple[float, list[str]]:
    start = time.perf_counter()
    texts = translator.translate(inputs, **direction)
    return time.perf_counter() - start, texts

  before_s, outputs = whole_file()
  reference = sentences_lib.join(layouts, outputs)
  command = [sys.executable, str(ROOT / "serve.py"), f"--workdir={args.workdir}",
             f"--port={args.port}", f"--cpu_devices={args.cpu_devices}",
             f"--max_tokens={max_tokens}", f"--max_batch={args.max_batch}",
             f"--max_wait_ms={args.max_wait_ms}", f"--max_sentences={args.max_batch}"]
  code = provenance.commit()  # Before the run writes its log beside the JSON.
  server, ready_s = serve_bench.start(command, Path(args.json).with_suffix(".log"), args.port)
  try:
    row = load(args.port, server.pid, paragraphs, args.clients)
  finally:
    server.terminate()
    server.wait(timeout=60)
  after_s, again = whole_file()
  assert again == outputs, "Translator.translate changed its output between passes"
  answers = row.pop("answers")
  whole = 2 * len(inputs) / (before_s + after_s)
  row.update(sentences=len(inputs), sentences_per_s=len(inputs) / row["wall_s"],
             whole_file_sentences_per_s=whole,
             answers_equal_to_translator=sum(a == r for a, r in zip(answers, reference)))
  row["vs_whole_file"] = row["sentences_per_s"] / whole
  print(f"{args.clients} clients, {len(paragraphs)} paragraphs of {len(inputs)} sentences: "
        f"{row['sentences_per_s']:.1f} sentences/s, {row['vs_whole_file']:.2f} of the whole "
        f"file's {whole:.1f} (aim {AIM}); {row['answers_equal_to_translator']}/{len(paragraphs)} "
        f"answers equal; RSS {row['rss_mb_start']:.0f} -> {row['rss_mb_end']:.0f} MiB "
        f"(max {row['rss_mb_max']:.0f})", flush=True)
  write_json(args.json, {"command": bench_command(), "serve_command": " ".join(
      ["python", "serve.py", *command[2:]]), "aim_vs_whole_file": AIM, "row": row,
      "whole_file_passes_s": [before_s, after_s], "server_ready_s": ready_s,
      "model": {"workdir": args.workdir, "steps_averaged": translator.checkpoint_steps[0],
                **{k: getattr(translator.model_config, k) for k in (
                    "vocab_size", "d_model", "num_layers", "max_len")}},
      **code, "machine": machine()})


if __name__ == "__main__":
  main()
