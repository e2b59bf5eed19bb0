"""Where decode.py's search and transformers' generate differ on an NLLB model: is it
float32 rounding (a near tie), or a difference of algorithm? (issue 77)

  /work/hfvenv/bin/python -m tools.nllb_equality --folder=/tmp/nllb600m --sentences=200 \\
      --targets=deu_Latn,fra_Latn --python=.venv/bin/python --json=OUT.json

A check, not a benchmark (bench/ times and measures): recorded as bench/nllb_equality.py at
13ed811 (results/bench/nllb_equality.json).

Runs under a Python with torch and transformers; the project's Python (--python) runs
the JAX side (this file with --jax_side) on `FOLDER_workdir` (import_model.py's, made
if missing). Both sides get the same tokens (NllbTokenizer's pieces: the source code
first, EOS last; the project's ids differ in the specials' places) and search at one
rule: beam 4, sum of log-probabilities, a hypothesis ends only among a step's 4 best, at
source tokens + --max_extra only EOS, scored by its log-probability, the target's code
forced first. JAX: the Translator's translate_nbest_ids with that code as prefix (as
decode.py forces it); torch: generate at bench/nllb_speed.py's settings
(`generate_kwargs`: its EOS processor, sources grouped by equal length).
1. float32 on both, every line and target: output tokens compared.
2. Each line whose tokens differ, again on both in float64 (torch's model loaded as
   float64; jax_enable_x64 with the parameters cast), one sentence a call. generate's
   beam search itself stays float32 (transformers 5.x casts each step's logits to
   float32 before its log-softmax and keeps beam scores in float32): its float64 run is
   a float64 model under a float32 search, so a line "identical in float64" is the
   stronger evidence and one that still differs may be a float32 tie on its side. Both
   float32 outputs are also scored by teacher forcing under torch in float64 (`gap`: how far
   apart the two hypotheses are under the exact model; `at_limit`: whether each output
   reached the length limit).
The JSON's `verdict`: "identical" (no line differs), "rounding" (every differing line is
identical in float64), or "differs" (some line differs in float64 too: exit 1).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import common  # noqa: E402  (bench's: stdlib only, importable under any Python)

BEAM = 4


def sources(count: int) -> list[str]:
  with gzip.open(common.MULTI30K / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
    return f.read().splitlines()[:count]


def jax_side(args) -> None:
  """The Translator's search of the jobs in --jobs (source pieces, forced target code):
  prints 'RESULT ' and per job [pieces without EOS, score]."""
  import jax
  if args.dtype == "float64":
    jax.config.update("jax_enable_x64", True)
  import jax.numpy as jnp
  import numpy as np

  from flax_transformer import workdir as workdir_lib
  from flax_transformer.translation.search_config import SearchConfig
  from flax_transformer.translation.translator import Translator

  search = SearchConfig(beam_size=BEAM, alpha=0.0, max_extra=args.max_extra,
                        eos_within_beam=True)
  translator = Translator.from_workdir(args.workdir, search=search, average_last=1)
  if args.dtype == "float64":
    config, params = translator.member()
    translator = Translator(
        config.replace(dtype="float64", param_dtype="float64"),
        jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), params),
        translator.tokenizer, search, languages=workdir_lib.languages(args.workdir))
  source, target = translator.tokenizer.source, translator.tokenizer.target
  jobs = json.loads(Path(args.jobs).read_text())
  one_call = args.dtype == "float64"  # Each sentence alone: no batch-shape effects.
  def ids(vocabulary, pieces: list[str]) -> np.ndarray:
    missing = [p for p in pieces if vocabulary.piece_id(p) is None]
    if missing:  # transformers' pieces must be the workdir's: else another input is searched.
      raise SystemExit(f"the workdir {args.workdir} has no id for transformers' pieces {missing}")
    return np.asarray([vocabulary.piece_id(p) for p in pieces], np.int32)

  found = []
  for chunk in ([[j] for j in jobs] if one_call else [jobs]):
    found += translator.translate_nbest_ids([ids(source, j["source"]) for j in chunk],
                                            [ids(target, [j["target"]]) for j in chunk])
  print("RESULT " + json.dumps([[target.pieces(h[0][0]), float(h[0][1])] for h in found]))


def run_jax(args, jobs: list[dict], dtype: str) -> list[list]:
  with tempfile.TemporaryDirectory() as scratch:
    path = Path(scratch) / "jobs.json"
    path.write_text(json.dumps(jobs))
    return common.run_child(
        [args.python, __file__, "--jax_side", f"--jobs={path}", f"--dtype={dtype}",
         f"--workdir={args.folder}_workdir", f"--max_extra={args.max_extra}"],
        f"the JAX search ({dtype})", env={**os.environ, "PYTHONPATH": str(common.ROOT)})


def generate(model, tokenizer, jobs: list[dict], max_extra: int, batch: int) -> list[list]:
  """generate's [pieces without the decoder start and EOS, None] per job, at
  nllb_speed's settings (`generate_kwargs`), jobs of equal source length and target
  batched together."""
  import torch
  from nllb_speed import generate_kwargs
  groups: dict = {}
  for i, job in enumerate(jobs):
    groups.setdefault((len(job["source"]), job["target"]), []).append(i)
  out: list = [None] * len(jobs)
  eos = model.config.eos_token_id
  for (length, target), members in groups.items():
    for s in range(0, len(members), batch):
      call = members[s:s + batch]
      inputs = torch.tensor([tokenizer.convert_tokens_to_ids(jobs[i]["source"]) for i in call])
      kwargs = generate_kwargs(model, tokenizer, length, target, max_extra)
      for i, ids in zip(call, model.generate(input_ids=inputs, **kwargs)):
        ids = ids.tolist()[1:]  # Without the decoder start.
        out[i] = [tokenizer.convert_ids_to_tokens(ids[:ids.index(eos)] if eos in ids else ids),
                  None]
  return out


def teacher_forced(model, tokenizer, source: list[str], pieces: list[str]) -> float:
  """log P(pieces + EOS | source) under `model` (its dtype), the decoder starting at EOS."""
  import torch
  eos = model.config.eos_token_id
  source, ids = tokenizer.convert_tokens_to_ids(source), tokenizer.convert_tokens_to_ids(pieces)
  decoder = torch.tensor([[model.config.decoder_start_token_id, *ids]])
  logits = model(input_ids=torch.tensor([source]), decoder_input_ids=decoder).logits[0]
  log_probs = torch.log_softmax(logits.to(model.dtype), dim=-1)
  return float(log_probs.gather(1, torch.tensor([*ids, eos])[:, None]).sum())


def flags():
  parser = common.parser(__doc__)
  parser.add_argument("--folder")
  parser.add_argument("--source", default="eng_Latn")
  parser.add_argument("--targets", default="deu_Latn,fra_Latn")
  parser.add_argument("--sentences", type=int, default=200)
  parser.add_argument("--max_extra", type=int, default=20)
  parser.add_argument("--batch", type=int, default=16, help="generate: sentences a call")
  parser.add_argument("--python", default=str(common.ROOT / ".venv" / "bin" / "python"))
  parser.add_argument("--jax_side", action="store_true", help=argparse_hidden())
  parser.add_argument("--jobs", help=argparse_hidden())
  parser.add_argument("--dtype", default="float32", help=argparse_hidden())
  parser.add_argument("--workdir", help=argparse_hidden())
  return parser.parse_args()


def argparse_hidden() -> str:
  import argparse
  return argparse.SUPPRESS


def differing_lines(model, model64, tokenizer, args, jobs, ours, theirs) -> list[dict]:
  """Per job whose float32 outputs differ: both outputs, their float64 decodes and the
  float64 teacher-forced scores of both float32 outputs."""
  todo = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a[0] != b[0]]
  if not todo:
    return []
  sub = [jobs[i] for i in todo]
  ours64 = run_jax(args, sub, "float64")
  theirs64 = generate(model64, tokenizer, sub, args.max_extra, batch=1)
  rows = []
  for n, i in enumerate(todo):
    source = jobs[i]["source"]
    exact = {name: teacher_forced(model64, tokenizer, source, out[i][0])
             for name, out in (("decode.py", ours), ("transformers", theirs))}
    rows.append({
        "line": jobs[i]["line"], "target": jobs[i]["target"],
        "float32": {"decode.py": ours[i], "transformers": theirs[i][0]},
        "float64_teacher_forced": exact,
        "gap": abs(exact["decode.py"] - exact["transformers"]),
        "at_limit": {name: len(out[i][0]) + 1 >= len(source) + args.max_extra
                     for name, out in (("decode.py", ours), ("transformers", theirs))},
        "float64": {"decode.py": ours64[n], "transformers": theirs64[n][0]},
        "identical_in_float64": ours64[n][0] == theirs64[n][0]})
  return rows


def main() -> None:
  args = flags()
  if args.jax_side:
    return jax_side(args)
  import torch
  import transformers
  from transformers import M2M100ForConditionalGeneration, NllbTokenizer

  torch.set_num_threads(2)
  torch.set_grad_enabled(False)
  folder, workdir = Path(args.folder), Path(f"{args.folder}_workdir")
  model = M2M100ForConditionalGeneration.from_pretrained(folder).eval()
  tokenizer = NllbTokenizer.from_pretrained(folder, src_lang=args.source)
  if not workdir.exists():
    common.run_script(args.python, "import_model.py", f"--from={folder}", f"--workdir={workdir}")
  texts, targets = sources(args.sentences), args.targets.split(",")
  jobs = [{"line": n + 1, "source": tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]),
           "target": target}
          for target in targets for n, text in enumerate(texts)]
  ours = run_jax(args, jobs, "float32")
  theirs = generate(model, tokenizer, jobs, args.max_extra, args.batch)
  rows = differing_lines(model, M2M100ForConditionalGeneration.from_pretrained(
      folder, torch_dtype=torch.float64).eval(), tokenizer, args, jobs, ours, theirs)
  identical = {t: sum(a[0] == b[0] for a, b, j in zip(ours, theirs, jobs)
                      if j["target"] == t) for t in targets}
  verdict = ("identical" if not rows else
             "rounding" if all(r["identical_in_float64"] for r in rows) else "differs")
  if rows:
    common.print_table([{"line": r["line"], "target": r["target"], "gap": r["gap"],
                         "identical_in_float64": r["identical_in_float64"]} for r in rows],
                       ["line", "target", "gap", "identical_in_float64"])
  print(f"float32 identical outputs: {identical} of {len(texts)} each; verdict: {verdict}")
  common.write_json(args.json, {
      "command": common.bench_command(), "folder": str(folder), "sentences": len(texts),
      "source": args.source, "targets": targets, "beam": BEAM, "max_extra": args.max_extra,
      "float32_identical": identical, "differing": rows, "verdict": verdict,
      "versions": {"transformers": transformers.__version__, "torch": torch.__version__}})
  if verdict == "differs":
    print("SOME LINES DIFFER IN FLOAT64 TOO: see `differing`", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  main()
