"""Beam search speed: sentences/s and tokens/s, beam 4, alpha 0.6.

python bench/decode.py [--workdir DIR] [--json PATH] [--repeats 5]
1. 'small-random': vocab 8000, d_model 256, 3+3 layers, 4 heads, d_ff 1024, random
   weights, 8 sources x 32 tokens, 63 decoding steps (the reference point's shape):
   a plain cached beam search (each beam its own cache row, reordered by a gather
   after every step, encoder-decoder keys/values per beam, as most implementations
   do) and ours (`share_beam_cache`: a sentence's beams share one cache row,
   self-attention entries stay where they were written and each beam reads its
   history through a mask), each on one CPU device and split over one device per
   core (`translation.translator.shard_search_fn`), all timed alternately in one run; same
   outputs checked.
2. With --workdir: the trained model over Multi30k test 2016 (1000 sentences), on
   one device and on one device per core.
3. --first_call --workdir DIR [--before COMMIT] [--sentences 300] [--rounds 3]: the first
   translation, cold (no persistent cache), of the first N test 2016 sentences:
   decode.py end to end (a process; wall seconds) and `Translator.translate`'s first
   call (a process: from_workdir, then the call; 1 CPU device, as a script gets by
   default; also with its compiles ahead on 2 threads instead of the library's half of
   the cores; and, where from_workdir takes them, with the sentences passed as
   `compile_for`, so their searches compile while the checkpoints load), for this
   checkout (and COMMIT's tree, git archive), in turn, round after round; to_first_s:
   from_workdir and the first call together. From the compile log lines: the shapes,
   each compile's seconds, their span (first start to last end) and the most that ran
   at once; outputs compared with the first row's of the same path.
"""

from __future__ import annotations

import argparse

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from common import MULTI30K, ROOT, bench_command, checkout, machine, median, print_table, \
    run_child, run_like_entry_points, timings, write_json

COMPILE = re.compile(r"Beam search for inputs (\[[\d, ]+\]) compiled in ([\d.]+) s")
# absl's prefix, anywhere in a line (tqdm's bar may precede it): I1127 22:15:20.476074 ...
STAMP = re.compile(r"[IWE]\d{4} (\d\d:\d\d:\d\d\.\d+) +\d+ [\w.]+:\d+\] (.*)$")

CACHES = {  # name -> TransformerConfig.share_beam_cache
    "plain cached beam search": False,  # A cache row per beam, gathered every step.
    "shared beam cache (ours)": True,
}


def random_model_rows(repeats: int) -> list[dict]:
  """Both cache variants on one device and on all devices, timed alternately."""
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from flax_transformer import Transformer, TransformerConfig
  from flax_transformer.translation.translator import SearchConfig, make_search_fn, shard_search_fn

  config = TransformerConfig(vocab_size=8000, d_model=256, d_ff=1024, num_heads=4,
                             num_layers=3, max_len=64, deterministic=True)
  inputs = np.random.default_rng(0).integers(2, 8000, (8, 32)).astype(np.int32)
  params = Transformer(config).init(jax.random.PRNGKey(0), inputs[:1], inputs[:1])["params"]
  key = jax.random.PRNGKey(0)
  searches, times, outputs = {}, {}, {}
  for devices in sorted({1, jax.device_count()}):
    mesh = Mesh(np.asarray(jax.devices()[:devices]), ("rows",))
    placed = (jax.device_put(params, NamedSharding(mesh, PartitionSpec())),
              jax.device_put(inputs, NamedSharding(mesh, PartitionSpec("rows"))))
    for name, shared in CACHES.items():
      # max_extra 31: up to 63 steps, and a random model rarely ends a sentence early.
      fn = make_search_fn(config.replace(share_beam_cache=shared),
                          SearchConfig(beam_size=4, alpha=0.6, max_extra=31))
      search = jax.jit(shard_search_fn(fn, mesh))
      row = (name, devices)
      searches[row] = lambda search=search, placed=placed: jax.block_until_ready(
          search(*placed, key))
      outputs[row], times[row] = searches[row](), []
  for _ in range(repeats):  # Alternating, so all see the same machine load.
    for row, search in searches.items():
      times[row] += timings(search, 1, warmup=0)
  rows = []
  plain = min(median(times[row]) for row in searches if not CACHES[row[0]])
  first = outputs[next(iter(outputs))].sequences
  for (name, devices), out in outputs.items():
    seconds = median(times[name, devices])
    lengths = (np.asarray(out.sequences[:, 0]) != 0).sum()
    rows.append({"model": f"small-random, {name}", "devices": devices, "batch": 8,
                 "beam_size": 4, "s_per_batch": seconds, "sentences_per_s": 8 / seconds,
                 "tokens_per_s": float(lengths) / seconds, "runs_s": times[name, devices],
                 "same_output_as_plain": bool(np.array_equal(out.sequences, first)),
                 # Against the faster plain search of the run (on 1 device or split).
                 "speedup_vs_plain": plain / seconds})
  return rows


def trained_model_rows(workdir: str, repeats: int) -> list[dict]:
  import jax
  import numpy as np

  from flax_transformer.data.sources import read_lines
  from flax_transformer.translation.translator import SearchConfig, Translator

  sentences = read_lines(MULTI30K / "test_2016_flickr.en.gz")
  translators = {n: Translator.from_workdir(workdir,
                                            search=SearchConfig(beam_size=4, alpha=0.6),
                                            devices=jax.devices()[:n])
                 for n in sorted({1, jax.device_count()})}
  outputs, times = {n: [] for n in translators}, {n: [] for n in translators}
  for n, translator in translators.items():
    outputs[n].append(translator.translate(sentences))  # Compiles every batch shape.
  for _ in range(repeats):
    for n, translator in translators.items():
      times[n] += timings(lambda: outputs[n].append(translator.translate(sentences)), 1,
                          warmup=0)
  rows = []
  for n, translator in translators.items():
    seconds, texts = median(times[n]), outputs[n][-1]
    tokens = [len(translator.tokenizer.tokenize(t)) for t in texts]
    rows.append({"model": f"trained ({workdir})", "devices": n,
                 "batch": translator.batch_tokens, "beam_size": 4, "s_per_batch": float("nan"),
                 "sentences_per_s": len(sentences) / seconds, "tokens_per_s": sum(tokens) / seconds,
                 "sentences": len(sentences), "mean_output_tokens": float(np.mean(tokens)),
                 "runs_s": times[n], "same_output_as_one_device": texts == outputs[1][-1]})
  return rows


def compiles(events: list[tuple[float, str]]) -> dict:
  """Search compiles from (seconds since start, log message) pairs: shapes, each one's
  seconds, and the most that ran at once (intervals end at their log line)."""
  spans = [(at - float(m[2]), at, m[1]) for at, text in events if (m := COMPILE.search(text))]
  # Seconds are logged to 0.1: a compile counts as running 0.15 s after its start.
  most = max((sum(start <= t + 0.15 < end for start, end, _ in spans) for t, _, _ in spans),
             default=0)
  return {"shapes": len(spans), "compile_s": {shape: end - start for start, end, shape in spans},
          "compile_span_s": (max(end for _, end, _ in spans) - min(s for s, _, _ in spans)
                             if spans else 0.0), "most_at_once": most}


def api_first_call(root: str, workdir: str, count: int, threads: int, ahead: bool) -> dict:
  """(In a process of its own, `root` first on the path.) from_workdir, then the first
  and a second `translate` of the first `count` test 2016 sentences; threads > 0: the
  compiles started ahead run on that many threads; ahead: from_workdir gets the
  sentences (`compile_for`)."""
  import concurrent.futures
  import logging

  sys.path.insert(0, root)
  from flax_transformer import compilation
  from flax_transformer.data.sources import read_lines
  from flax_transformer.translation import translator as translator_lib

  if threads:  # The variant measured: the library's pool, made bigger before any compile.
    compilation._executor = concurrent.futures.ThreadPoolExecutor(threads)  # noqa: SLF001

  assert translator_lib.__file__.startswith(root), translator_lib.__file__
  events = []
  started = time.perf_counter()

  class Events(logging.Handler):  # Seconds since the first call: compiles started ahead, < 0.
    def emit(self, record):
      events.append((time.perf_counter(), record.getMessage()))

  logging.getLogger().addHandler(Events())
  logging.getLogger().setLevel(logging.INFO)
  sentences = read_lines(MULTI30K / "test_2016_flickr.en.gz")[:count]
  translator = translator_lib.Translator.from_workdir(
      workdir, search=translator_lib.SearchConfig(beam_size=4, alpha=0.6), average_last=5,
      **({"compile_for": sentences} if ahead else {}))
  load_s = time.perf_counter() - started
  call_started = time.perf_counter()
  texts = translator.translate(sentences)
  first_s = time.perf_counter() - call_started
  warm_s = timings(lambda: translator.translate(sentences), 1, warmup=0)[0]
  return {"load_s": load_s, "wall_s": first_s, "to_first_s": load_s + first_s,
          "warm_s": warm_s, **compiles([(at - call_started, text) for at, text in events]),
          "outputs_sha1": hashlib.sha1("\n".join(texts).encode()).hexdigest()}


def decode_py(root: str, workdir: str, count: int) -> dict:
  """decode.py of `root` over the first `count` test 2016 sentences, cold: wall seconds,
  compiles from its log."""
  from flax_transformer.data.sources import read_lines

  with tempfile.TemporaryDirectory() as scratch:
    source, output = Path(scratch, "in.en"), Path(scratch, "out.de")
    source.write_text("\n".join(read_lines(MULTI30K / "test_2016_flickr.en.gz")[:count]) + "\n")
    started = time.time()
    done = subprocess.run(
        [sys.executable, str(Path(root, "decode.py")), f"--workdir={workdir}",
         f"--input={source}", f"--output={output}", "--compilation_cache_dir=", "--beam_size=4",
         "--alpha=0.6", "--average_last=5"],
        cwd=root, capture_output=True, text=True, env=dict(os.environ, XLA_FLAGS=""))
    wall = time.time() - started
    if done.returncode:
      sys.exit(f"{root}: decode.py failed:\n{done.stderr[-2000:]}")
    day, events = datetime.fromtimestamp(started).date(), []
    for line in done.stderr.replace("\r", "\n").splitlines():
      if match := STAMP.search(line):
        at = datetime.combine(day, datetime.strptime(match[1], "%H:%M:%S.%f").time())
        events.append((at.timestamp() - started, match[2]))
    return {"wall_s": wall, **compiles(events),
            "outputs_sha1": hashlib.sha1(output.read_bytes().rstrip(b"\n")).hexdigest()}


def first_call_rows(args) -> list[dict]:
  """Section 3: per checkout and path, medians over the rounds."""
  with tempfile.TemporaryDirectory() as scratch:
    roots = {}
    if args.before:
      roots[args.before] = checkout(args.before, scratch)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    roots[f"{head} + working tree"] = str(ROOT)
    api = {"Translator API": (0, False), "Translator API, compiles on 2 threads": (2, False),
           "Translator API, compile_for": (0, True)}

    def paths(root):
      takes = "compile_for" in Path(root, "flax_transformer/translation/translator.py").read_text()
      return ["decode.py", *(path for path, (_, ahead) in api.items() if takes or not ahead)]

    runs = {(name, path): [] for name, root in roots.items() for path in paths(root)}
    for _ in range(args.rounds):
      for name, root in roots.items():
        runs[name, "decode.py"].append(decode_py(root, args.workdir, args.sentences))
        for path in paths(root)[1:]:
          threads, ahead = api[path]
          runs[name, path].append(run_child(
              [sys.executable, __file__, "--api_child", root, "--workdir", args.workdir,
               "--sentences", str(args.sentences), "--threads", str(threads)]
              + ["--ahead"] * ahead, f"{name}: {path}"))
  rows = []
  for (name, path), results in runs.items():
    first = next(r for (n, p), r in runs.items() if (p == "decode.py") == (path == "decode.py"))
    rows.append({"checkout": name, "path": path, "sentences": args.sentences,
                 "wall_s": median([r["wall_s"] for r in results]),
                 "to_first_s": median([r.get("to_first_s", r["wall_s"]) for r in results]),
                 "shapes": results[0]["shapes"],
                 "compile_span_s": median([r["compile_span_s"] for r in results]),
                 "most_at_once": max(r["most_at_once"] for r in results),
                 "same_outputs_as_first": all(r["outputs_sha1"] == first[0]["outputs_sha1"]
                                              for r in results),
                 "runs": results})
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", help="a trained Multi30k workdir (adds its rows)")
  parser.add_argument("--json", help="write the results here")
  parser.add_argument("--repeats", type=int, default=5, help="timed runs (median reported)")
  parser.add_argument("--cpu_devices", type=int, default=0,
                      help="CPU devices to split over (0 = one per core), as decode.py")
  parser.add_argument("--first_call", action="store_true", help="section 3 alone")
  parser.add_argument("--before", help="--first_call: the commit to compare against")
  parser.add_argument("--sentences", type=int, default=300, help="--first_call: how many")
  parser.add_argument("--rounds", type=int, default=3, help="--first_call: runs of each")
  parser.add_argument("--api_child", help=argparse.SUPPRESS)
  parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--ahead", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.api_child:
    print("RESULT " + json.dumps(api_first_call(args.api_child, args.workdir, args.sentences,
                                                args.threads, args.ahead)))
    return
  if args.first_call:
    rows = first_call_rows(args)
    print_table(rows, ["checkout", "path", "sentences", "wall_s", "to_first_s", "shapes",
                       "compile_span_s",
                       "most_at_once", "same_outputs_as_first"])
    write_json(args.json, {"command": bench_command(),
                           "workdir": args.workdir, "rows": rows, "machine": machine()})
    return
  from flax_transformer.cli import common as cli

  cli.set_cpu_devices(args.cpu_devices)
  run_like_entry_points()
  rows = random_model_rows(args.repeats)
  ours = min((r for r in rows if "ours" in r["model"]), key=lambda r: r["s_per_batch"])
  plain = min((r for r in rows if "plain" in r["model"]), key=lambda r: r["s_per_batch"])
  if args.workdir:
    rows += trained_model_rows(args.workdir, max(1, args.repeats // 2))
  print_table(rows, ["model", "devices", "batch", "beam_size", "s_per_batch", "sentences_per_s",
                     "tokens_per_s", "speedup_vs_plain"])
  # The headline: the faster of ours against the faster plain search, same run.
  record = {**ours, "plain_s_per_batch": plain["s_per_batch"], "plain_devices": plain["devices"],
            "rows": rows, "machine": machine()}
  write_json(args.json, record)


if __name__ == "__main__":
  main()
