"""decode.py against transformers' generate on an NLLB model, into two targets (issue 77).

  /work/hfvenv/bin/python bench/nllb_speed.py --folder=/tmp/nllb600m --sentences=200 \\
      --targets=deu_Latn,fra_Latn --rounds=2 --json=OUT.json

Recorded (results/bench/nllb_speed.json, BENCHMARKS.md) with --rounds=1: on 2 cores a
round of 200 sentences into two targets takes many minutes per engine, so round 1's
decode.py seconds include its compiles.

Runs under a Python with torch and transformers; the project's Python (--python) runs
import_model.py and decode.py. --folder: an M2M100ForConditionalGeneration folder with
NllbTokenizer's files (bench/import_memory.py --make_with makes one of
NLLB-200-distilled-600M's shape with random weights). On the first --sentences English
lines of Multi30k's test 2016, for each target, beam 4 at the length rule both share
(generate: length_penalty 0, EOS forced at source tokens + --max_extra, the target's
code forced first; decode.py: --alpha=0 --eos_within_beam), alternating rounds of:
- decode.py, one launch per target as a user runs it (its compilation cache fresh per
  bench run: round 1 compiles, later rounds read it);
- generate in this process (model loaded once), sources grouped by equal token length
  (each group its own length limit), at most --batch a call; torch on 2 threads.
The outputs' texts are compared line by line (decode.py's against
NllbTokenizer.decode(skip_special_tokens=True)).
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


def generate_all(model, tokenizer, texts, targets, *, batch: int, max_extra: int) -> dict:
  """target -> generate's output texts (beam 4, length_penalty 0), in the texts' order."""
  sys.path.insert(0, str(common.ROOT / "tests" / "fixtures"))
  from make_pretrained import generation_kwargs
  by_length: dict[int, list[int]] = {}
  for i, text in enumerate(texts):
    by_length.setdefault(len(tokenizer(text)["input_ids"]), []).append(i)
  calls = [group[s:s + batch] for group in by_length.values() for s in range(0, len(group), batch)]
  out = {}
  for target in targets:
    texts_out = [""] * len(texts)
    for call in calls:
      inputs = tokenizer([texts[i] for i in call], return_tensors="pt")
      kwargs = {**generation_kwargs(model, inputs["input_ids"][0], 4, model.config.eos_token_id),
                "max_new_tokens": inputs["input_ids"].shape[1] + max_extra,
                "return_dict_in_generate": False, "output_scores": False,
                "forced_bos_token_id": tokenizer.convert_tokens_to_ids(target)}
      for i, ids in zip(call, model.generate(**inputs, **kwargs)):
        texts_out[i] = tokenizer.decode(ids, skip_special_tokens=True)
    out[target] = texts_out
  return out


def main() -> None:
  parser = common.parser(__doc__)
  parser.add_argument("--folder", required=True)
  parser.add_argument("--source", default="eng_Latn")
  parser.add_argument("--targets", default="deu_Latn,fra_Latn")
  parser.add_argument("--sentences", type=int, default=200)
  parser.add_argument("--max_extra", type=int, default=20)
  parser.add_argument("--batch", type=int, default=16, help="generate: sentences a call")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--python", default=str(common.ROOT / ".venv" / "bin" / "python"))
  args = parser.parse_args()
  load_start = os.getloadavg()
  folder, workdir = Path(args.folder), Path(f"{args.folder}_workdir")
  if not workdir.exists():
    common.run_script(args.python, "import_model.py", f"--from={folder}", f"--workdir={workdir}")
  import torch
  import transformers
  from transformers import M2M100ForConditionalGeneration, NllbTokenizer

  torch.set_num_threads(2)
  torch.set_grad_enabled(False)
  model = M2M100ForConditionalGeneration.from_pretrained(folder).eval()
  tokenizer = NllbTokenizer.from_pretrained(folder, src_lang=args.source)
  texts, targets = sources(args.sentences), args.targets.split(",")
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
  identical = {t: sum(a == b for a, b in zip((tmp / t).read_text().splitlines(), theirs[t]))
               for t in targets}
  common.print_table(rows, ["engine", "median_s", "sentences_per_s", "vs_transformers"])
  print(f"identical outputs: {identical} of {len(texts)} each")
  common.write_json(args.json, {
      "command": common.bench_command(), "folder": str(folder), "sentences": len(texts),
      "source": args.source, "targets": targets, "beam": 4, "max_extra": args.max_extra,
      "rows": rows, "identical_outputs": identical,
      "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
      "load_average": {"start": load_start, "end": os.getloadavg()}})


if __name__ == "__main__":
  main()
