"""WMT14 EN-DE at its size (4.5M pairs) prepared for training, stage by stage.

python bench/wmt_scale.py --scratch DIR [--pairs 4500000] [--json PATH]

Stages, each in its own process (so that its peak RSS is its own):
  generate    tools/wmt_corpus.py's pairs written as the statmt.org archives
  prepare     tfds's own wmt14_translate/de-en builder -> array_record (offline)
  vocab       the shared sentencepiece vocabulary (config.vocab_size, 37k), trained
              as train.py trains it: config.vocab_max_sentences pairs, evenly spread
  tokens      the token cache (data/token_cache.py): every pair tokenized once
Stages whose output exists in --scratch are not redone (--redo forces them). The folder is
what bench/soak.py runs on. Its stages first_batch, throughput and train (issue 46, closed;
retired since) made results/bench/wmt_scale.json's at the commit each names (last 154afea).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

START = time.time()
from common import MULTI30K, bench_command, dir_bytes, parser, peak_rss_mb, print_table, \
    run_child, write_json  # noqa: E402

STAGES = ("generate", "prepare", "vocab", "tokens")


def _config(args):
  from configs import base

  config = base.get_config()
  config.data_dir = str(args.scratch / "data")
  config.vocab_path = str(args.scratch / "vocab.model")
  config.data_workers = 0
  config.token_cache_dir = str(args.scratch / "tokens")
  return config


def stage_generate(args) -> dict:
  import numpy as np

  from tools import wmt14_offline, wmt_corpus

  train = wmt_corpus.write_subset_texts(MULTI30K, args.pairs, seed=0)
  dev = list(wmt_corpus.pairs(MULTI30K, 3000, seed=1))
  test = list(wmt_corpus.pairs(MULTI30K, 3003, seed=2))
  generated = time.time() - START
  words = np.array([[len(d.split()), len(e.split())] for subset in train.values()
                    for d, e in subset])
  sample = [p for subset in train.values() for p in subset[:100_000]]
  archives = wmt14_offline.write_archives(
      args.scratch / "archives", {a: {"de": p} for a, p in train.items()},
      {"de": [d for d, _ in dev], "en": [e for _, e in dev]}, {"de": test})
  return {"pairs": int(len(words)), "generate_s": generated,
          "write_archives_s": time.time() - START - generated,
          "archive_bytes": sum(p.stat().st_size for p in archives),
          "subset_pairs": {a: len(p) for a, p in train.items()},
          "words_mean_en": float(words[:, 1].mean()), "words_mean_de": float(words[:, 0].mean()),
          "words_p50_en": float(np.median(words[:, 1])),
          "words_p99_en": float(np.percentile(words[:, 1], 99)),
          "words_max_en": int(words[:, 1].max()),
          "fraction_over_100_words_en": float((words[:, 1] > 100).mean()),
          "word_types_first_300k_pairs": {
              "en": len({w for _, e in sample for w in e.split()}),
              "de": len({w for d, _ in sample for w in d.split()})}}


def stage_prepare(args) -> dict:
  from tools import wmt14_offline

  wmt14_offline.prepare("de-en", args.scratch / "data", args.scratch / "archives",
                        args.scratch / "tfds_scratch")
  prepared = next((args.scratch / "data" / "wmt14_translate" / "de-en").iterdir())
  from flax_transformer.data import sources

  count = len(sources.TfdsPairs("wmt14_translate/de-en", "train", "en", "de",
                                data_dir=str(args.scratch / "data"), download=False))
  return {"prepare_s": time.time() - START, "train_pairs": count,
          "array_record_bytes": dir_bytes(prepared),
          "extracted_bytes": dir_bytes(args.scratch / "data" / "downloads" / "extracted")}


def stage_vocab(args) -> dict:
  from flax_transformer.data import pipeline as data
  from flax_transformer.data.sources import load_pairs

  config = _config(args)
  if args.vocab_pairs:
    config.vocab_max_sentences = args.vocab_pairs
  pairs = load_pairs(config, config.train_split)
  training = config.copy_and_resolve_references()
  training.vocab_path = ""  # Train it (into the path given), as a first launch does.
  tokenizer = data.build_tokenizer(training, config.vocab_path, pairs)
  return {"vocab_s": time.time() - START, "vocab_size": tokenizer.vocab_size,
          "vocab_sample_pairs": min(len(pairs), config.vocab_max_sentences)}


def stage_tokens(args) -> dict:
  from flax_transformer.data import pipeline as data
  from flax_transformer.data.sources import load_pairs
  from flax_transformer.data.tokenizer import Tokenizer

  config = _config(args)  # As a launch opens its pairs and vocabulary.
  pairs, tokenizer = load_pairs(config, config.train_split), Tokenizer(config.vocab_path)
  ids = data.training_ids(config, pairs, data.TokenizePair(tokenizer))
  if isinstance(ids, list):  # At most PRETOKENIZE_MAX_PAIRS pairs: held in memory instead.
    return {"tokens_s": time.time() - START, "in_memory": True}
  return {"tokens_s": time.time() - START, "token_cache_bytes": dir_bytes(ids.folder),
          "tokens": ids.meta["tokens"], "dtype": ids.meta["dtype"]}


def run_stage(args, name: str) -> dict:
  # This script's own flags (the last --scratch wins: the resolved one).
  command = [sys.executable, __file__, *sys.argv[1:], "--stage", name, "--scratch",
             str(args.scratch)]
  start = time.time()
  return {**run_child(command, f"stage {name}"), "stage_wall_s": time.time() - start}


def _save(args, name: str, record: dict) -> None:
  """Adds one stage's record to --json: stages run separately (--stages) gather in one
  file, each with its own command and commit."""
  import platform

  from flax_transformer import provenance

  code = provenance.git_commit()
  record.update(command=bench_command(),
                commit=code.get("git_commit"), git_dirty=code.get("git_dirty"))
  if args.json:
    path = Path(args.json)
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged.update(pairs=args.pairs, cores=os.cpu_count(), python=platform.python_version())
    merged.setdefault("stages", {})[name] = record
    write_json(args.json, merged)


def main():
  flags = parser(__doc__)
  flags.add_argument("--scratch", type=Path, required=True, help="working folder (GBs)")
  flags.add_argument("--pairs", type=int, default=4_500_000)
  flags.add_argument("--vocab_pairs", type=int, default=0,
                     help="pairs sampled for the vocabulary (0 = config.vocab_max_sentences)")
  flags.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
  flags.add_argument("--redo", action="store_true", help="redo stages whose output exists")
  flags.add_argument("--stage", help="(one stage's own process)")
  args = flags.parse_args()
  args.scratch = args.scratch.resolve()

  if args.stage:
    from absl import flags as absl_flags

    absl_flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags.
    record = globals()[f"stage_{args.stage}"](args)
    record["peak_rss_mb"] = peak_rss_mb(children=True)
    print("RESULT " + json.dumps(record), flush=True)
    return

  args.scratch.mkdir(parents=True, exist_ok=True)
  done = {"generate": args.scratch / "archives" / "dev.tgz",
          "prepare": args.scratch / "data" / "wmt14_translate" / "de-en",
          "vocab": args.scratch / "vocab.model", "tokens": args.scratch / "tokens"}
  results = {}
  for name in args.stages:
    if name in done and done[name].exists() and not args.redo:
      print(f"{name}: output exists in {args.scratch}, kept (--redo to remake it)")
      continue
    if name in done and args.redo:
      shutil.rmtree(done[name], ignore_errors=True) if done[name].is_dir() else \
          done[name].unlink(missing_ok=True)
    print(f"{name} ...", flush=True)
    results[name] = run_stage(args, name)
    print(json.dumps(results[name])[:400], flush=True)
    _save(args, name, results[name])

  rows = [{"stage": n, "wall_s": r["stage_wall_s"], "peak_rss_mb": r["peak_rss_mb"]}
          for n, r in results.items()]
  print_table(rows, ["stage", "wall_s", "peak_rss_mb"])


if __name__ == "__main__":
  main()
