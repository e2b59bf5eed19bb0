"""transformers' M2M100ForConditionalGeneration on an imported M2M100/NLLB workdir exported
by export.py --format=transformers, against decode.py on that workdir.

  /work/hfvenv/bin/python bench/export_m2m100.py \\
      --json=results/bench/export_m2m100.json

Runs under a Python with torch, transformers and sentencepiece (never the project's venv,
whose suite must not need them); the project's own Python (--python) runs
import_model.py, export.py and decode.py. For each of the committed fixtures
(tests/fixtures/m2m100 and nllb, made by tests/fixtures/make_m2m100.py):
- import_model.py of the folder, export.py --format=transformers of the workdir;
- the export's files: model.safetensors against the source folder's, tensor by tensor;
- its tokenizer (loaded as the source folder's class) against the source folder's
  tokenizer: source and target ids of every sentence, each direction;
- greedy: generate (the export's generation_config.json: num_beams=1 as exported, never
  padding, EOS forced at the limit; forced_bos_token_id = the target's token, at most
  len(source) + max_extra new tokens: decode.py's limit) against decode.py
  --beam_size=1, line for line, from English into three targets;
- scores: the summed log-probabilities of the references (the target's language token
  first, EOS last) against decode.py --score.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (stdlib only: importable under any Python)

MAX_EXTRA = 20
TARGETS = ("de", "fr", "cs")  # ISO codes: decode.py resolves them to the model's.
FIXTURES = common.ROOT / "tests" / "fixtures"
NLLB = {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn", "cs": "ces_Latn"}


def pairs(name: str) -> tuple[list[str], dict[str, list[str]]]:
  """The fixture's English sources, and a target text for each per target language: its
  Multi30k reference (de, fr), else the source itself (cs: any text scores)."""
  ref = json.loads((FIXTURES / name / "references.json").read_text(encoding="utf-8"))
  lines = list(dict.fromkeys(ref["sources"]))
  known = {(s, lang): t for s, lang, t in zip(ref["sources"], ref["target_langs"],
                                               ref["targets"])}
  return lines, {lang: [known.get((s, lang), s) for s in lines] for lang in TARGETS}


def tokenizers(name: str, folder: Path):
  from transformers import M2M100Tokenizer, NllbTokenizer
  return (NllbTokenizer if name == "nllb" else M2M100Tokenizer).from_pretrained(folder)


def encode(name: str, tokenizer, text: str, target: str | None, target_lang: str):
  code = (lambda c: NLLB[c]) if name == "nllb" else (lambda c: c)
  tokenizer.src_lang, tokenizer.tgt_lang = code("en"), code(target_lang)
  if name == "nllb":  # NllbTokenizer's setter does not reset the target mode.
    tokenizer.set_src_lang_special_tokens(code("en"))
  return tokenizer(text, text_target=target)


def compare(name: str, run, tmp: Path) -> dict:
  """One fixture: import, export, then transformers against decode.py."""
  import numpy as np
  import torch
  from safetensors.numpy import load_file
  from transformers import AutoModelForSeq2SeqLM

  workdir, hf = tmp / f"{name}_run", tmp / f"{name}_hf"
  run("import_model.py", f"--from={FIXTURES / name}", f"--workdir={workdir}")
  run("export.py", f"--workdir={workdir}", f"--out={hf}", "--format=transformers",
      "--beam_size=1")
  theirs, ours = load_file(FIXTURES / name / "model.safetensors"), load_file(hf / "model.safetensors")
  tensors_equal = sorted(theirs) == sorted(ours) and all(
      np.array_equal(theirs[k], ours[k]) for k in theirs)
  exported, original = tokenizers(name, hf), tokenizers(name, FIXTURES / name)
  model = AutoModelForSeq2SeqLM.from_pretrained(hf).eval()
  lines, targets = pairs(name)
  (tmp / "src.en").write_text("".join(s + "\n" for s in lines))
  out: dict = {"model_class": type(model).__name__, "sentences": len(lines),
               "safetensors_equal_to_source_folder": tensors_equal, "directions": {}}
  for lang in TARGETS:
    refs = targets[lang]
    (tmp / f"ref.{lang}").write_text("".join(t + "\n" for t in refs))
    flags = [f"--workdir={workdir}", f"--input={tmp / 'src.en'}", "--source_lang=en",
             f"--target_lang={lang}", "--nointeractive"]
    run("decode.py", *flags, f"--output={tmp / 'greedy'}", "--beam_size=1",
        f"--max_extra={MAX_EXTRA}")
    run("decode.py", *flags, f"--score={tmp / f'ref.{lang}'}", f"--output={tmp / 'scores'}")
    our_greedy = (tmp / "greedy").read_text(encoding="utf-8").splitlines()
    our_scores = [float(l.split("\t")[0]) for l in (tmp / "scores").read_text().splitlines()]
    same_ids, greedy, scores = True, [], []
    for source, ref in zip(lines, refs):
      mine, before = (encode(name, t, source, ref, lang) for t in (exported, original))
      same_ids &= (mine["input_ids"] == before["input_ids"]
                   and mine["labels"] == before["labels"])
      inputs = torch.tensor([mine["input_ids"]])
      forced = mine["labels"][0]
      with torch.no_grad():
        done = model.generate(inputs, forced_bos_token_id=forced,
                              max_new_tokens=len(mine["input_ids"]) + MAX_EXTRA)
        logits = model(input_ids=inputs, labels=torch.tensor([mine["labels"]])).logits[0]
      text = exported.decode(done[0].tolist(), skip_special_tokens=True)
      if name == "m2m100" and text.startswith("__"):  # M2M100Tokenizer keeps '__de__'.
        text = text.split(" ", 1)[1] if " " in text else ""
      greedy.append(text)
      log_probs = torch.log_softmax(logits, -1)
      scores.append(float(log_probs[torch.arange(len(mine["labels"])),
                                    torch.tensor(mine["labels"])].sum()))
    diff = [abs(a - b) for a, b in zip(scores, our_scores)]
    out["directions"][f"en->{lang}"] = {
        "token_ids_equal_to_source_folder_tokenizer": bool(same_ids),
        "greedy_equal_lines": sum(a == b for a, b in zip(greedy, our_greedy)),
        "greedy_differing": [{"line": i + 1, "decode_py": a, "transformers": b} for i, (a, b)
                             in enumerate(zip(our_greedy, greedy)) if a != b],
        "score_max_abs_diff": max(diff), "scores_within_0_001": sum(d <= 1e-3 for d in diff)}
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--python", default=str(common.ROOT / ".venv" / "bin" / "python"),
                      help="the project's Python (import_model.py, export.py, decode.py)")
  parser.add_argument("--json", default=None, help="where to write the record")
  args = parser.parse_args()
  import torch
  import transformers

  torch.manual_seed(0)
  run = functools.partial(common.run_script, args.python)
  tmp = Path(tempfile.mkdtemp(prefix="export_m2m100_"))
  record = {"command": common.bench_command(), "max_extra": MAX_EXTRA,
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
            "fixtures": {name: compare(name, run, tmp) for name in ("m2m100", "nllb")}}
  print(json.dumps(record, indent=1))
  if args.json:
    common.write_json(args.json, record)


if __name__ == "__main__":
  main()
