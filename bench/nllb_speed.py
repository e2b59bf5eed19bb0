"""decode.py against transformers' generate on an NLLB model, into two targets (issue 77).

  /work/hfvenv/bin/python bench/nllb_speed.py --folder=/tmp/nllb600m --sentences=200 \\
      --targets=deu_Latn,fra_Latn --rounds=2 --json=OUT.json

Recorded (results/bench/nllb_speed.json, BENCHMARKS.md) with --rounds=1: on 2 cores a
round of 200 sentences into two targets takes many minutes per engine, so round 1's
decode.py seconds include its compiles.

Runs under a Python with torch and transformers; the project's Python (--python) runs
import_model.py and decode.py. --folder: an M2M100ForConditionalGeneration folder with
NllbTokenizer's files (bench/import_memory.py --make_with makes one of
NLLB-200-distilled-600M's shape with random weights, the rows of the ids its tokenizer
has no piece for zeroed so that outputs are text). Refused (exit 2) before timing: a
folder whose model emits, greedily on the first sentence, ids its tokenizer cannot
spell (outputs would be empty), or a `FOLDER_workdir` older than the folder's files.
On the first --sentences English lines of Multi30k's test 2016, for each target, beam 4
at the rule both share (generate: length_penalty 0, the target's code forced first, at
source tokens + --max_extra only EOS, scored by its log-probability as decode.py scores
it: tests/fixtures/make_pretrained.py's `eos_at_limit` stands in for transformers'
forced_eos_token_id, which scores it 0; decode.py: --alpha=0 --eos_within_beam),
alternating rounds of:
- decode.py, one launch per target as a user runs it (its compilation cache fresh per
  bench run: round 1 compiles, later rounds read it);
- generate in this process (model loaded once), sources grouped by equal token length
  (each group its own length limit), at most --batch a call; torch on 2 threads.
The outputs' texts are compared line by line (decode.py's against
NllbTokenizer.decode(skip_special_tokens=True)). An empty line shows nothing, so the
JSON's `equality` is "shown" only when every line of every target is identical and
non-empty, else "vacuous" (identical, some empty) or "differs"; per target it records
`identical_outputs`, `nonempty_outputs` (each engine's), `identical_nonempty` and the
first lines of each engine (`examples`). Exit 1 (after the table and JSON) unless shown.
"""

from __future__ import annotations

import gzip
import os
import sys
import tempfile
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (stdlib only: importable under any Python)


def sources(count: int) -> list[str]:
  with gzip.open(common.MULTI30K / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
    return f.read().splitlines()[:count]


def generate_kwargs(model, tokenizer, source_length: int, target: str, max_extra: int) -> dict:
  """generate's settings for beam 4 at decode.py's rule (--alpha=0 --eos_within_beam
  --max_extra): sum of log-probabilities, EOS at source tokens + max_extra scored as
  decode.py scores it (`eos_at_limit`), `target`'s code forced first."""
  from transformers import LogitsProcessorList
  sys.path.insert(0, str(common.ROOT / "tests" / "fixtures"))
  from make_pretrained import eos_at_limit, generation_kwargs
  eos = model.config.eos_token_id
  kwargs = generation_kwargs(model, [None] * source_length, 4, eos)
  limit = 1 + source_length + max_extra  # The decoder start, then the new tokens.
  return {**kwargs, "max_new_tokens": source_length + max_extra, "forced_eos_token_id": None,
          "logits_processor": LogitsProcessorList([eos_at_limit(limit, eos)]),
          "return_dict_in_generate": False, "output_scores": False,
          "forced_bos_token_id": tokenizer.convert_tokens_to_ids(target)}


def generate_all(model, tokenizer, texts, targets, *, batch: int, max_extra: int) -> dict:
  """target -> generate's output texts (`generate_kwargs`), in the texts' order."""
  by_length: dict[int, list[int]] = {}
  for i, text in enumerate(texts):
    by_length.setdefault(len(tokenizer(text)["input_ids"]), []).append(i)
  calls = [group[s:s + batch] for group in by_length.values() for s in range(0, len(group), batch)]
  out = {}
  for target in targets:
    texts_out = [""] * len(texts)
    for call in calls:
      inputs = tokenizer([texts[i] for i in call], return_tensors="pt")
      kwargs = generate_kwargs(model, tokenizer, inputs["input_ids"].shape[1], target,
                               max_extra)
      for i, ids in zip(call, model.generate(**inputs, **kwargs)):
        texts_out[i] = tokenizer.decode(ids, skip_special_tokens=True)
    out[target] = texts_out
  return out


def compare(ours: dict, theirs: dict, count: int) -> dict:
  """The JSON's equality fields from target -> each engine's output lines."""
  fields = {"identical_outputs": {}, "nonempty_outputs": {}, "identical_nonempty": {},
            "examples": {}}
  for target, lines in ours.items():
    pairs = list(zip(lines, theirs[target]))
    fields["identical_outputs"][target] = sum(a == b for a, b in pairs)
    fields["identical_nonempty"][target] = sum(a == b != "" for a, b in pairs)
    fields["nonempty_outputs"][target] = {"decode.py": sum(a != "" for a in lines),
                                          "transformers": sum(b != "" for b in theirs[target])}
    fields["examples"][target] = [{"decode.py": a, "transformers": b} for a, b in pairs[:3]]
  shown = all(n == count for n in fields["identical_nonempty"].values())
  same = all(n == count and len(ours[t]) == count
             for t, n in fields["identical_outputs"].items())
  fields["equality"] = "shown" if shown and same else "vacuous" if same else "differs"
  return fields


def refuse_unusable(folder: Path, workdir: Path, model, tokenizer, text: str, target: str):
  """Exits 2 naming the problem when the run could not show equality or would time a
  stale import; the check costs one short greedy generate."""
  newest = max(f.stat().st_mtime for f in folder.iterdir())
  if workdir.exists() and workdir.stat().st_mtime < newest:
    print(f"{workdir} is older than {folder}'s files: remove it to re-import", file=sys.stderr)
    raise SystemExit(2)
  inputs = tokenizer([text], return_tensors="pt")
  ids = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=8,
                       forced_bos_token_id=tokenizer.convert_tokens_to_ids(target))[0]
  unspelled = sorted(set(ids.tolist()) - set(tokenizer.get_vocab().values()))
  if unspelled:
    print(f"--folder={folder}: its model generates ids its tokenizer has no piece for "
          f"({unspelled[:5]}): outputs would decode to empty text; make the folder with "
          "bench/import_memory.py's make", file=sys.stderr)
    raise SystemExit(2)


def flags():
  parser = common.parser(__doc__)
  parser.add_argument("--folder", required=True)
  parser.add_argument("--source", default="eng_Latn")
  parser.add_argument("--targets", default="deu_Latn,fra_Latn")
  parser.add_argument("--sentences", type=int, default=200)
  parser.add_argument("--max_extra", type=int, default=20)
  parser.add_argument("--batch", type=int, default=16, help="generate: sentences a call")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--python", default=str(common.ROOT / ".venv" / "bin" / "python"))
  return parser.parse_args()


def main() -> None:
  args = flags()
  load_start = os.getloadavg()
  folder, workdir = Path(args.folder), Path(f"{args.folder}_workdir")
  import torch
  import transformers
  from transformers import M2M100ForConditionalGeneration, NllbTokenizer

  torch.set_num_threads(2)
  torch.set_grad_enabled(False)
  model = M2M100ForConditionalGeneration.from_pretrained(folder).eval()
  tokenizer = NllbTokenizer.from_pretrained(folder, src_lang=args.source)
  texts, targets = sources(args.sentences), args.targets.split(",")
  refuse_unusable(folder, workdir, model, tokenizer, texts[0], targets[0])
  if not workdir.exists():
    common.run_script(args.python, "import_model.py", f"--from={folder}", f"--workdir={workdir}")
  tmp = Path(tempfile.mkdtemp(prefix="nllb_speed_"))
  (tmp / "src.txt").write_text("".join(t + "\n" for t in texts))
  theirs: dict = {}

  def decode_py() -> None:
    for target in targets:
      common.run_script(
          args.python, "decode.py", f"--workdir={workdir}", f"--input={tmp / 'src.txt'}",
          f"--output={tmp / target}", f"--source_lang={args.source}",
          f"--target_lang={target}", "--beam_size=4", "--alpha=0", "--eos_within_beam",
          f"--max_extra={args.max_extra}", "--average_last=1", "--nointeractive",
          f"--compilation_cache_dir={tmp / 'cache'}")

  def generate() -> None:
    theirs.update(generate_all(model, tokenizer, texts, targets, batch=args.batch,
                               max_extra=args.max_extra))

  times = common.alternating({"decode.py": decode_py, "transformers": generate}, args.rounds)
  rows = [{"engine": name, "seconds": seconds, "median_s": median(seconds),
           "sentences_per_s": len(texts) * len(targets) / median(seconds)}
          for name, seconds in times.items()]
  for row in rows:
    row["vs_transformers"] = row["sentences_per_s"] / rows[-1]["sentences_per_s"]
  equal = compare({t: (tmp / t).read_text().splitlines() for t in targets}, theirs, len(texts))
  common.print_table(rows, ["engine", "median_s", "sentences_per_s", "vs_transformers"])
  print(f"identical outputs: {equal['identical_outputs']} of {len(texts)} each; "
        f"identical and non-empty: {equal['identical_nonempty']}; "
        f"non-empty: {equal['nonempty_outputs']}")
  common.write_json(args.json, {
      "command": common.bench_command(), "folder": str(folder), "sentences": len(texts),
      "source": args.source, "targets": targets, "beam": 4, "max_extra": args.max_extra,
      "rows": rows, **equal,
      "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
      "load_average": {"start": load_start, "end": os.getloadavg()}})
  if equal["equality"] != "shown":
    print(f"EQUALITY NOT SHOWN ({equal['equality']}): see identical_nonempty and examples",
          file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  main()
