"""decode.py, the exported StableHLO runner and CTranslate2 (float32, int8), side by side.

python bench/export.py --workdir=DIR [--runs 3] [--json results/bench/export.json]

One trained workdir (the README job's model), Multi30k test 2016 (1000 sentences),
beam 4, alpha 0.6, max_extra 50, on this machine's cores. The workdir is exported
with export.py (StableHLO; CTranslate2 float32 and int8). Each engine runs in its
own process, alternating over --runs rounds: its load time (process start to a
model ready, imports included), a first pass over test 2016 (compiles included),
a second pass (sentences/s), its peak RSS. CTranslate2 runs twice per round: as the
runner does (a 1-thread worker per core) and with one worker whose threads share each
batch. Then: BLEU of each first pass (sacrebleu,
default 13a), lines identical to decode.py's, the real decode.py command's output
against the runner's, and greedy outputs on 100 validation sentences, ours against
CTranslate2's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()  # A worker's load time counts from here: imports included.
from common import MULTI30K, ROOT, bench_command, dir_bytes, machine, median, parser, \
    print_table, run_child, write_json  # noqa: E402 (after START; flax_transformer is not imported)
# CTranslate2 as the runner runs it (one 1-thread worker per core), and with its
# threads sharing each batch instead (one worker, a thread per core).
SHARED = ", 1 worker x all threads"
ENGINES = ("decode.py", "stablehlo runner", "ctranslate2 float32", "ctranslate2 int8",
           "ctranslate2 float32" + SHARED, "ctranslate2 int8" + SHARED)


def _worker(args) -> None:
  """One engine in this process: load, translate twice, report as JSON."""
  lines = Path(args.input).read_text(encoding="utf-8").splitlines()
  if args.worker == "decode.py":
    from flax_transformer.cli.common import set_cpu_devices

    set_cpu_devices(0)  # As decode.py: one device per core.
    from flax_transformer.translation.translator import SearchConfig, Translator

    model = Translator.from_workdir(args.model, search=SearchConfig(beam_size=args.beam_size),
                                    average_last=5)
    translate = model.translate
  else:
    import importlib.util

    # The copy export.py wrote beside the model, not the package's module.
    spec = importlib.util.spec_from_file_location("translate", Path(args.model) / "translate.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    if args.worker == "stablehlo runner":
      runner._use_cpu_cores(0)
      model = runner.Runner(args.model)
      translate = model.translate
    else:
      shared = dict(workers=1, threads=len(os.sched_getaffinity(0)))
      model = runner.Ct2Runner(args.model, **(shared if args.worker.endswith(SHARED) else {}))
      translate = lambda x: model.translate(x, beam_size=args.beam_size)  # noqa: E731
  load_s = time.perf_counter() - START
  start = time.perf_counter()
  out = translate(lines)
  first_s = time.perf_counter() - start
  second_s = None
  if not args.once:
    start = time.perf_counter()
    translate(lines)
    second_s = time.perf_counter() - start
  Path(args.output).write_text("".join(line + "\n" for line in out), encoding="utf-8")
  import resource

  # Not common.peak_rss_mb: it imports flax_transformer, which the runners must not need.
  print("RESULT " + json.dumps({
      "load_s": load_s, "first_pass_s": first_s, "second_pass_s": second_s,
      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      "imports_flax_transformer": "flax_transformer" in sys.modules}))


def _spawn(engine: str, model: str, source: Path, output: Path, env: dict, *,
           beam_size: int = 4, once: bool = False) -> dict:
  command = [sys.executable, str(Path(__file__).resolve()), f"--worker={engine}",
             f"--model={model}", f"--input={source}", f"--output={output}",
             f"--beam_size={beam_size}"] + (["--once"] if once else [])
  return run_child(command, engine, env)


def _read(path: Path) -> list[str]:
  return path.read_text(encoding="utf-8").splitlines()


def main() -> None:
  flags = parser(__doc__)
  flags.add_argument("--workdir", help="a trained Multi30k EN->DE workdir")
  flags.add_argument("--runs", type=int, default=3)
  flags.add_argument("--sentences", type=int, default=0, help="first N of test 2016 (dry runs)")
  # One engine's process (_spawn): these flags are its arguments.
  flags.add_argument("--worker", choices=ENGINES)
  flags.add_argument("--model")
  flags.add_argument("--input")
  flags.add_argument("--output")
  flags.add_argument("--beam_size", type=int, default=4)
  flags.add_argument("--once", action="store_true")
  args = flags.parse_args()
  if args.worker:
    return _worker(args)

  import sacrebleu

  from flax_transformer import provenance
  from flax_transformer.data.sources import read_lines
  from flax_transformer.training import host_allocator

  env = dict(os.environ, XLA_FLAGS="", GLIBC_TUNABLES=host_allocator.TUNABLES)
  scratch = Path(tempfile.mkdtemp(prefix="bench_export_"))
  source = scratch / "test.en"
  count = args.sentences or None
  source.write_text("\n".join(read_lines(MULTI30K / "test_2016_flickr.en.gz")[:count]) + "\n")
  references = read_lines(MULTI30K / "test_2016_flickr.de.gz")[:count]
  validation = scratch / "val100.en"
  validation.write_text("\n".join(read_lines(MULTI30K / "val.en.gz")[:100]) + "\n")

  models = {"decode.py": args.workdir}
  exports = {}
  for engine, folder, flags in (("stablehlo runner", "stablehlo", []),
                                ("ctranslate2 float32", "ct2_f32", ["--format=ctranslate2"]),
                                ("ctranslate2 int8", "ct2_int8", ["--format=ctranslate2",
                                                                  "--quantization=int8"])):
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "export.py"), f"--workdir={args.workdir}",
                    f"--out={scratch / folder}", *flags], check=True, capture_output=True,
                   env=env)
    exports[engine] = {"export_s": time.perf_counter() - start,
                       "disk_mb": dir_bytes(scratch / folder) / 2 ** 20}
    models[engine] = str(scratch / folder)

  for engine in ENGINES[4:]:
    models[engine] = models[engine.removesuffix(SHARED)]
  runs: dict[str, list[dict]] = {engine: [] for engine in ENGINES}
  for run in range(args.runs):
    for engine in ENGINES:
      result = _spawn(engine, models[engine], source, scratch / f"{engine}.{run}.de", env)
      runs[engine].append(result)
      print(f"run {run + 1}/{args.runs} {engine}: {result}", flush=True)

  # The real command line, once: its output is what the runner must equal.
  start = time.perf_counter()
  subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={args.workdir}",
                  f"--input={source}", f"--output={scratch / 'decode_cli.de'}",
                  "--compilation_cache_dir="], check=True, capture_output=True, env=env)
  decode_cli_s = time.perf_counter() - start
  decode_cli = _read(scratch / "decode_cli.de")

  reference_out = _read(scratch / "decode.py.0.de")
  rows = []
  for engine in ENGINES:
    out = _read(scratch / f"{engine}.0.de")
    stable = all(_read(scratch / f"{engine}.{r}.de") == out for r in range(args.runs))
    second = [r["second_pass_s"] for r in runs[engine]]
    rows.append({
        "engine": engine,
        "load_s": median([r["load_s"] for r in runs[engine]]),
        "first_pass_s": median([r["first_pass_s"] for r in runs[engine]]),
        "sentences_per_s": len(out) / median(second),
        "bleu": sacrebleu.corpus_bleu(out, [references]).score,
        "peak_rss_mb": median([r["peak_rss_mb"] for r in runs[engine]]),
        "lines_equal_to_decode_py": sum(a == b for a, b in zip(out, reference_out)),
        "same_output_every_run": stable,
        "imports_flax_transformer": runs[engine][0]["imports_flax_transformer"],
        "runs": runs[engine], **exports.get(engine, {})})
  base = rows[0]["sentences_per_s"]
  for row in rows:
    row["speedup_vs_decode_py"] = row["sentences_per_s"] / base
    row["bleu_minus_decode_py"] = row["bleu"] - rows[0]["bleu"]

  greedy = {}
  for engine in ("decode.py", "ctranslate2 float32", "ctranslate2 int8"):
    _spawn(engine, models[engine], validation, scratch / f"greedy {engine}.de", env,
           beam_size=1, once=True)
    greedy[engine] = _read(scratch / f"greedy {engine}.de")
  record = {
      "command": bench_command(),
      **provenance.commit(),
      "machine": machine(), "workdir": args.workdir, "sentences": len(reference_out),
      "search": {"beam_size": 4, "alpha": 0.6, "max_extra": 50}, "runs": args.runs,
      "rows": rows,
      "decode_cli": {"wall_s": decode_cli_s,
                     "lines_equal_to_stablehlo_runner": sum(
                         a == b for a, b in zip(decode_cli, _read(
                             scratch / "stablehlo runner.0.de"))),
                     "bleu": sacrebleu.corpus_bleu(decode_cli, [references]).score},
      "greedy_validation_100": {
          engine: sum(a == b for a, b in zip(greedy[engine], greedy["decode.py"]))
          for engine in greedy},
  }
  print_table(rows, ["engine", "load_s", "first_pass_s", "sentences_per_s", "bleu",
                     "peak_rss_mb", "lines_equal_to_decode_py", "speedup_vs_decode_py"])
  print(json.dumps({k: record[k] for k in ("decode_cli", "greedy_validation_100")}, indent=1))
  write_json(args.json, record)


if __name__ == "__main__":
  main()
