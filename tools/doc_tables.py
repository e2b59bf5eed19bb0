"""The docs' rendered tables (tools/render_docs.py's TABLES) and each run folder's page,
from the files under results/: the runs' records (results/runs/NAME/NAME.json), the bench
scripts' JSON (results/bench/) and the device sessions' (results/device_runs/)."""

from __future__ import annotations

import json
import statistics
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

# results/runs/<name>/: one training run's record (<name>.json), hypotheses, plots, logs;
# results/bench/: the bench scripts' JSON.
RUNS, BENCH = "results/runs", "results/bench"


def run_json(name: str) -> str:
  """A training run's record, relative to the repository ('multi30k_en-de' ->
  'results/runs/multi30k_en-de/multi30k_en-de.json')."""
  return f"{RUNS}/{name}/{name}.json"


def run_record(root: Path, name: str) -> dict:
  """A training run's record ('multi30k_en-de' -> its NAME.json)."""
  return json.loads((root / run_json(name)).read_text())


def bench_json(root: Path, name: str) -> dict:
  """A bench script's JSON under results/bench/ ('scaling' -> its record)."""
  return json.loads((root / BENCH / f"{name}.json").read_text())


def table(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def runs_and_median(cells: list[list[float]], formats: list[str], bold=()) -> list[list[str]]:
  """Rows 1..n of a bench's repeated runs (each column formatted by its format spec)
  and the row of their medians, the columns numbered in `bold` in bold."""
  text = lambda row: [format(x, f) for x, f in zip(row, formats)]  # noqa: E731
  median = text([statistics.median(column) for column in zip(*cells)])
  median = [f"**{m}**" if i in bold else m for i, m in enumerate(median)]
  return [[f"{i}", *text(c)] for i, c in enumerate(cells, start=1)] + [["**median**", *median]]


def scores(record: dict) -> list[str]:
  """Test BLEU, lowercased BLEU and chrF, as sacreBLEU gives them, to one decimal."""
  return [f"{record[k]:.1f}" for k in ("bleu", "bleu_lowercase", "chrf")]


def averaged(record: dict) -> int:
  steps = record.get("averaged_checkpoints") or []
  return len(steps[0]) if steps and isinstance(steps[0], list) else len(steps)


def rows_of(root: Path, doc: str) -> list[dict]:
  """The runs a doc's table shows, in order, with their labels (results/runs/tables.json)."""
  return json.loads((root / RUNS / "tables.json").read_text())[doc]


def readme_results(root: Path) -> str:
  rows = []
  for row in rows_of(root, "readme"):
    name = row["run"]
    record = run_record(root, name)
    last = averaged(record)
    label = row["config"] + (f", last {last} averaged" if last != 5 else "")
    rows.append([row["pair"], label, f"{record['steps']:d}",
                 f"{record['train_wall_s'] / 60:.0f} min", *scores(record), f"`{name}.json`"])
  return table(["pair", "config", "steps", "train wall time", "BLEU", "lowercased", "chrF",
                "JSON"], rows)


def results_runs(root: Path) -> str:
  """Every run decoded on test, in the order they were made."""
  rows = []
  for row in rows_of(root, "results"):
    record = run_record(root, row["run"])
    members = record.get("members")
    steps = f"{len(members)} runs, {record['steps']:d}" if members else f"{record['steps']:d}"
    wall = f"{record['train_wall_s'] / 60:.1f} min" + (" (sum)" if members else "")
    rows.append([row["label"], steps, wall, f"{averaged(record)}", *scores(record),
                 f"`{row['run']}.json`"])
  return table(["run", "steps", "train wall time", "checkpoints averaged",
                "test BLEU (sacreBLEU, cased, detok.)", "lowercased BLEU", "chrF", "JSON"], rows)


def _gb(n_bytes: float) -> str:
  return f"{n_bytes / 1e9:.2f} GB"


def wmt_scale(root: Path) -> str:
  """bench/wmt_scale.py at 4.5M pairs: each stage's time, disk and peak RSS."""
  st = bench_json(root, "wmt_scale")["stages"]
  g, p, v, t, f, th, tr = (st[k] for k in ("generate", "prepare", "vocab", "tokens",
                                            "first_batch", "throughput", "train"))
  rss = lambda r: f"{r['peak_rss_mb'] / 1024:.2f} GB"  # noqa: E731
  rows = [
      ["generate the corpus, write the statmt.org archives",
       f"{g['generate_s'] + g['write_archives_s']:.0f} s", _gb(g["archive_bytes"]), rss(g)],
      ["tfds's wmt14_translate/de-en builder -> array_record (unpacking included)",
       f"{p['prepare_s']:.0f} s", f"{_gb(p['array_record_bytes'])} (+ "
       f"{_gb(p['extracted_bytes'])} unpacked)", rss(p)],
      [f"vocabulary: 37k BPE from {v['vocab_sample_pairs']:,} pairs", f"{v['vocab_s']:.0f} s",
       "", rss(v)],
      ["token cache: every pair tokenized once", f"{t['tokens_s']:.0f} s",
       _gb(t["token_cache_bytes"]), rss(t)],
      ["first batch, fresh launch", f"{f['first_batch_fresh_s']:.1f} s", "", ""],
      [f"first batch, resuming at pair {f['resume_at_pair']:,}",
       f"{f['first_batch_resume_s']:.1f} s", "", rss(f)],
      [f"train.py, configs/base.py, {tr['train_steps']} steps", f"{tr['train_wall_s']:.0f} s",
       "", rss(tr)],
  ]
  out = table(["stage", "time", "disk", "peak RSS"], rows)
  labels = {"0": "in the training process (one core)", "1": "one input worker process",
            "0_on_the_fly": "in the training process, tokenizing on the fly (no cache)"}
  rows = [[labels.get(k, k), f"{r['tokens_per_s']:,.0f}", f"{r['nonpad_fraction']:.3f}"]
          for k, r in th["by_workers"].items()]
  return out + "\n" + table(["packed batches formed", "real tokens/s (both sides)",
                              "non-pad fraction"], rows)


def soak(root: Path) -> str:
  """bench/soak.py: train.py on the 4.5M-pair corpus, killed once, resumed, finished."""
  record = bench_json(root, "soak")
  mb = lambda x: f"{x / 1024:.2f} GB"  # noqa: E731
  rows = []
  for result in record["soaks"]:
    workers = result["workers"]
    label = f"{workers}" if workers >= 0 else f"default ({record['auto_workers_here']} here)"
    for name, run in result["runs"].items():
      end = {"reference": f"step {record['steps']}",
             "killed": f"kill -9 once step {record['kill_at']}'s checkpoint was complete",
             "resumed": f"resumed at step {result['resumed_from_step']}, to {record['steps']}"}
      rows.append([label, end[name], f"{run['first_batch_s']:.1f} s", f"{run['wall_s']:.0f} s",
                   str(run["processes"]), mb(run["peak_tree_rss_mb"]),
                   mb(run["peak_tree_pss_mb"]),
                   ("yes" if result["bit_exact"] else "NO") if name == "resumed" else ""])
  return table(["input workers", "launch", "first batch", "wall time", "processes",
                "peak tree RSS", "peak tree PSS", "parameters equal the reference's"], rows)


def wmt_download(root: Path) -> str:
  """The archives tfds registers for each WMT14 config, and our measured preparation."""
  record = bench_json(root, "projection")["tfds_registry"]
  stages = bench_json(root, "wmt_scale")["stages"]
  prepare, vocab, tokens = (stages[k] for k in ("prepare", "vocab", "tokens"))
  seconds = prepare["prepare_s"] + vocab["vocab_s"] + tokens["tokens_s"]
  disk = prepare["array_record_bytes"] + prepare["extracted_bytes"] + tokens["token_cache_bytes"]
  measured = f"{seconds / 60:.0f} min, {_gb(disk)}"
  rows = [[name, f"{len(r['urls'])}", _gb(r["download_bytes"]),
           measured if name.endswith("de-en") else "not measured"] for name, r in record.items()]
  return table(["tfds config", "archives", "download (tfds's registered sizes)",
                "then: prepare, vocabulary, token cache on 2 cores (time, disk; measured on "
                "the 4.5M-pair stand-in, BENCHMARKS.md)"], rows)


def one_decimal(x: float, published: str | None = None) -> str:
  """x to one decimal; on a tie (37.05) the published rounding, when it is either one."""
  half_up = str(Decimal(str(x)).quantize(Decimal("0.1"), ROUND_HALF_UP))
  return published if published in (f"{x:.1f}", half_up) else f"{x:.1f}"


def torch_runs(root: Path) -> str:
  """bench/train_step.py on the 2026-11-26 host against torch: compiled (run1-3), eager."""
  rows = []
  for index, config in enumerate(("small", "base")):
    for run in ("run1", "run2", "run3", "eager_run1", "eager_run2"):
      r = json.loads((root / BENCH / f"train_step_runs/2026-11-26_torch_compiled/{run}.json")
                     .read_text())["results"][index]
      rows.append([run, config, f"{r['ms_per_step']:.0f}",
                   "" if run.startswith("eager") else f"{r['fraction_of_matmul_peak']:.1%}",
                   f"{r['torch_ms_per_step']:.0f}", f"{r['speedup_vs_torch']:.2f}x"])
  return table(["run", "config", "ours ms/step", "of matmul peak", "torch ms/step",
                "speed-up vs torch"], rows).replace("|  |", "| |")


def decode_runs(root: Path) -> str:
  """bench/decode.py's five runs on the 2026-11-26 host and their medians (seconds per
  batch, ours on two devices against the faster plain search, trained sentences/s)."""
  cells = []
  for run in range(1, 6):
    r = json.loads((root / BENCH / f"decode_runs/2026-11-26/run{run}.json").read_text())["rows"]
    fastest_plain = min(r[0]["s_per_batch"], r[2]["s_per_batch"]) / r[3]["s_per_batch"]
    trained = [r[4]["sentences_per_s"], r[5]["sentences_per_s"]]
    cells.append([*(x["s_per_batch"] for x in r[:4]), fastest_plain, *trained,
                  trained[1] / trained[0]])
  return table(["run", "plain, 1 device", "ours, 1 device", "plain, 2 devices", "ours, 2 devices",
                "ours 2 devices vs the faster plain", "trained, 1 device", "trained, 2 devices",
                "trained, ratio"],
               runs_and_median(cells, [".3f"] * 4 + [".2f", ".1f", ".1f", ".2f"], bold=(4, 7)))


def curves(root: Path, steps, *rows) -> str:
  """Validation curves by step, one row per (label, run name, 'bleu' or 'wall'[, {step:
  published tie rounding}]): BLEU to one decimal or wall time in minutes; blank where a
  run has no point at a step."""
  out = []
  for label, name, what, *ties in rows:
    points = {s: (w / 60 if what == "wall" else b)
              for s, w, b in run_record(root, name)["validation_bleu_curve"]}
    out.append([label] + [one_decimal(points[s], *[t.get(s) for t in ties]) if s in points
                          else "" for s in steps])
  return table(["step", *map(str, steps)], out).replace("|  |", "| |").replace("|  |", "| |")


def curve_points(root: Path, name: str, bleu: str = "validation BLEU") -> str:
  """A run's validation curve as step, wall time and BLEU rows (as its folder's page)."""
  curve = run_record(root, name)["validation_bleu_curve"]
  return table(["step", "wall time", bleu],
               [[f"{s}", f"{w / 60:.1f} min", f"{b:.2f}"] for s, w, b in curve])


# The GPU issue's second round: one H100 session, runs A and B of bench/accelerator.py.
H100_RUNS = "results/device_runs/2026-11-27_h100_5ecb8c5"
PRNG_LABELS = {"ours": "train.py's defaults at 5ecb8c5: threefry GPU kernel, autodiff backward",
               "threefry_xla_lowering": "threefry, XLA's lowering (jax's default)",
               "rbg": "rbg (threefry's GPU kernel on, for key derivation)",
               "unsafe_rbg": "unsafe_rbg (likewise)",
               "fused_cross_entropy": "fused cross-entropy backward, GPU kernel on"}


def h100_variants(root: Path) -> str:
  """Our train step with one choice changed, timed alternately with the peer's."""
  rows = []
  for section, run, name in (("base_bf16", "A", "accelerator"),
                             ("small_f32", "B", "accelerator_run2")):
    record = json.loads((root / H100_RUNS / f"{name}.json").read_text())[section]
    entries = [("ours", {"ms": record["ours_ms"], "compile_s": record["ours_compile_s"],
                         "speedup_vs_peer": record["speedup_vs_peer"], "over_ours": 1.0})]
    for key, v in entries + list(record["variants"].items()):
      rows.append([section.replace("_", " "), PRNG_LABELS[key], f"{v['ms']:.2f}",
                   f"{v['over_ours']:.3f}", f"{v['speedup_vs_peer']:.2f}x",
                   f"{v['compile_s']:.1f} s", run])
    rows.append([section.replace("_", " "), "the peer (Flax examples/wmt)",
                 f"{record['peer_ms']:.2f}", "", "1x", f"{record['peer_compile_s']:.1f} s", run])
  return table(["shape", "train step", "ms/step", "time / ours", "speed vs peer",
                "compile", "run"], rows)


# What each kind of file in a run's folder is, by name pattern (the first that matches).
RUN_FILES = [("*.hyp", "hypotheses"),
             ("curves_*.png", "loss and BLEU curves (tools/plot_curves.py)"),
             ("attention_*.png", "attention plots (decode.py --attention_plot)"),
             ("run.json", "train.py's run record (config, versions, launches)"),
             ("*metrics.jsonl", "train.py's logged metrics"), ("*train.log", "train.py's log"),
             ("decode_*.log", "decode.py's log"), ("results.log", "tools/results.py's log"),
             ("paired_bs_*.txt", "sacreBLEU's paired bootstrap test"),
             ("test_bleu_confidence.txt", "sacreBLEU's 95% bootstrap interval on test"),
             ("first20_losses_*.txt", "the first 20 losses logged"), ("*.md", "notes"), ("*", "")]


def run_readme(root: Path, name: str) -> str:
  """results/runs/NAME/README.md: the run's record (NAME.json) as a page, and its files."""
  folder = root / RUNS / name
  r = run_record(root, name)
  label = {row["run"]: row["label"] for row in rows_of(root, "results")}.get(name)
  steps = r.get("averaged_checkpoints") or []
  rows = [["pair", r["pair"].upper().replace("-", "->")], ["command", f"`{r['command']}`"]]
  if r.get("members"):
    rows.append(["ensemble of", ", ".join(f"`{m['workdir']}` ({m['steps']} steps)"
                                         for m in r["members"])])
  if r.get("git_commit"):
    rows.append(["trained at commit", r["git_commit"][:7]])
  rows += [["steps", f"{r['steps']:d}"], ["train wall time", f"{r['train_wall_s'] / 60:.1f} min"],
           ["checkpoints averaged", f"{averaged(r)}" + (f" (steps {steps[0]}-{steps[-1]})"
                                                        if steps and isinstance(steps[0], int)
                                                        else "")],
           ["search", f"beam {r['beam_size']}, alpha {r['alpha']}" if "beam_size" in r
            else "not recorded (the results script's default then)"],
           [f"{r['split']}: BLEU (sacreBLEU, cased, detok.)", f"{r['bleu']:.2f}"],
           ["lowercased BLEU", f"{r['bleu_lowercase']:.2f}"], ["chrF", f"{r['chrf']:.2f}"]]
  out = [f"# {name}\n", *([label + "\n"] if label else []),
         f"Rendered from [`{name}.json`]({name}.json) by `python -m tools.render_docs` "
         "(edit the JSON, not this page).\n", table(["", ""], rows)]
  if r.get("validation_bleu_curve"):
    out += ["## Validation BLEU by step (newest checkpoint)\n", curve_points(root, name, "BLEU")]
  files = sorted(p for p in folder.iterdir() if p.name != "README.md")
  described = lambda p: next(text for pattern, text in RUN_FILES if p.match(pattern))  # noqa: E731
  out += ["## Files\n", "\n".join(
      f"- [`{p.name}{'/' if p.is_dir() else ''}`]({p.name})"
      + (": this record" if p.name == f"{name}.json" else
         f": {described(p)}" if described(p) and not p.is_dir() else "") for p in files) + "\n"]
  return "\n".join(out)


def run_readmes(root: Path) -> dict[str, str]:
  """Each run folder's README.md (relative path -> text), rendered afresh."""
  return {f"{RUNS}/{d.name}/README.md": run_readme(root, d.name)
          for d in sorted((root / RUNS).iterdir()) if (d / f"{d.name}.json").is_file()}
