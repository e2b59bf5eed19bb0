"""Beam search's kernels per step and its CPU wall time, before and after a change.

python bench/search_kernels.py --before COMMIT [--rounds 3] [--json results/bench/search_kernels.json]
The paper's base shape (vocab 32000, d_model 512, 6+6 layers, 8 heads, d_ff 2048, float32,
random weights), beam 4, alpha 0.6, source length 32, up to 63 steps (a random model
seldom ends early), one CPU device. Kernels: the instructions of the compiled while
loop's body (`jax.jit(...).lower(...).compile().as_text()`), less those that launch
nothing (parameter, get-tuple-element, tuple, constant, bitcast), split into the
decoder's (op_name under Transformer.decode) and the search's own. Each variant runs
in a process of its own, in turn, round after round: COMMIT's tree (git archive), this
checkout, and this checkout with a fixed-length loop (every step up to the bound, no
early-exit test). Wall time: median of the rounds' runs at batch 8 and 32.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (ROOT, bench_command, checkout, machine, median, print_table, run_child,
                    while_loop_body, write_json)

BATCHES = (8, 32)
SOURCE_LEN, EXTRA, BEAM = 32, 31, 4
FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}


def while_body_kernels(hlo: str) -> dict:
  """Counts of the launching instructions in the body of `hlo`'s largest while loop."""
  opcodes, parts = collections.Counter(), collections.Counter()
  for line in while_loop_body(hlo):
    opcode = re.search(r"\s([a-z][a-z\-]*)\(", line.split("=", 1)[1])[1]
    if opcode in FREE:
      continue
    opcodes[opcode] += 1
    op_name = re.search(r'op_name="([^"]*)"', line)
    parts["decoder" if op_name and "Transformer.decode" in op_name[1] else "search"] += 1
  return {"total": sum(opcodes.values()), **parts, "by_opcode": dict(opcodes.most_common())}


def child(root: str, fixed_length: bool, runs: int) -> dict:
  """One variant's kernels and timed searches (run in its own process)."""
  sys.path.insert(0, root)
  from unittest import mock

  import jax
  import numpy as np

  from flax_transformer import Transformer, TransformerConfig
  from flax_transformer.translation import search as search_lib
  from flax_transformer.translation.translator import SearchConfig, make_search_fn

  assert Path(search_lib.__file__).is_relative_to(root), search_lib.__file__
  config = TransformerConfig(vocab_size=32000, d_model=512, d_ff=2048, num_heads=8,
                             num_layers=6, max_len=SOURCE_LEN + EXTRA, deterministic=True)
  sample = np.ones((1, SOURCE_LEN), np.int32)
  params = jax.jit(Transformer(config).init)(jax.random.PRNGKey(0), sample, sample)["params"]
  search = jax.jit(make_search_fn(config, SearchConfig(beam_size=BEAM, alpha=0.6,
                                                       max_extra=EXTRA)))
  rng, out = jax.random.PRNGKey(0), {}
  plain_while = jax.lax.while_loop

  def every_step(cond, body, state):  # The bound alone ends the loop.
    return plain_while(lambda s: s.step < SOURCE_LEN + EXTRA, body, state)

  for batch in BATCHES:
    inputs = np.random.default_rng(batch).integers(2, 32000, (batch, SOURCE_LEN), np.int32)
    started = time.perf_counter()
    with mock.patch.object(jax.lax, "while_loop", every_step if fixed_length else plain_while):
      compiled = search.lower(params, inputs, rng).compile()
    compile_s = time.perf_counter() - started
    result = jax.block_until_ready(compiled(params, inputs, rng))  # Warm-up.
    seconds = []
    for _ in range(runs):
      started = time.perf_counter()
      jax.block_until_ready(compiled(params, inputs, rng))
      seconds.append(time.perf_counter() - started)
    out[str(batch)] = {
        "kernels": while_body_kernels(compiled.as_text()), "compile_s": compile_s,
        "runs_s": seconds,
        "outputs_sha1": hashlib.sha1(np.asarray(result.sequences).tobytes()
                                     + np.asarray(result.scores).tobytes()).hexdigest()}
  return out


def commit_of(root: Path) -> str:
  return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                        text=True).stdout.strip()


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--before", help="the commit to compare against (git archive of it)")
  parser.add_argument("--rounds", type=int, default=3, help="processes per variant, in turn")
  parser.add_argument("--runs", type=int, default=3, help="timed searches per process")
  parser.add_argument("--json", help="write the results here")
  parser.add_argument("--skip_fixed_length", action="store_true",
                      help="leave out the fixed-length loop variant")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("--fixed_length", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print("RESULT " + json.dumps(child(args.child, args.fixed_length, args.runs)))
    return
  dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "flax_transformer"],
                              cwd=ROOT, capture_output=True, text=True).stdout.strip())
  with tempfile.TemporaryDirectory() as scratch:
    variants = {}
    if args.before:
      variants[f"{args.before} (before)"] = (checkout(args.before, scratch), False)
    here = f"{commit_of(ROOT)}{' + working tree' if dirty else ''}"
    variants[f"{here} (after)"] = (str(ROOT), False)
    if not args.skip_fixed_length:
      variants[f"{here}, fixed-length loop"] = (str(ROOT), True)
    records = {name: [] for name in variants}
    for _ in range(args.rounds):
      for name, (root, fixed) in variants.items():
        command = [sys.executable, __file__, "--child", root, "--runs", str(args.runs)]
        records[name].append(run_child(command + ["--fixed_length"] * fixed, name))
  rows = []
  for name, runs in records.items():
    for batch in map(str, BATCHES):
      first = runs[0][batch]
      rows.append({"variant": name, "batch": int(batch), **{
          f"kernels_{k}": first["kernels"][k] for k in ("total", "decoder", "search")},
          "s_per_search": median([s for r in runs for s in r[batch]["runs_s"]]),
          "compile_s": median([r[batch]["compile_s"] for r in runs]),
          "runs_s": [s for r in runs for s in r[batch]["runs_s"]],
          "kernels": first["kernels"], "outputs_sha1": first["outputs_sha1"]})
  for row in rows:  # Against the first variant's row of the same batch, same run.
    base = next(r for r in rows if r["batch"] == row["batch"])
    row["time_vs_first"] = row["s_per_search"] / base["s_per_search"]
    row["same_outputs_as_first"] = row["outputs_sha1"] == base["outputs_sha1"]
  print_table(rows, ["variant", "batch", "kernels_total", "kernels_decoder", "kernels_search",
                     "s_per_search", "time_vs_first", "compile_s", "same_outputs_as_first"])
  write_json(args.json, {
      "command": bench_command(),
      "shape": {"vocab": 32000, "d_model": 512, "layers": 6, "heads": 8, "d_ff": 2048,
                "dtype": "float32", "beam_size": BEAM, "alpha": 0.6, "source_len": SOURCE_LEN,
                "max_decode_len": SOURCE_LEN + EXTRA},
      "rounds": args.rounds, "runs_per_round": args.runs, "rows": rows, "machine": machine()})


if __name__ == "__main__":
  main()
