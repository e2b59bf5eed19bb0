"""decode.py against transformers' generate on a model of OPUS-MT's base shape (issue 67).

  python bench/pretrained_speed.py --folder=workdirs/opus_base \\
      --sentences=64 --max_extra=2 --rounds=5 --json=results/bench/pretrained_speed.json

Runs under a Python with torch, transformers and sentencepiece (pip install ...); the
project's Python (--python) runs import_model.py, decode.py and the Translator. Unless
--folder exists, makes the model: MarianMTModel(MarianConfig) of opus-mt-en-de's shape
(d_model 512, 8 heads, d_ff 2048, 6+6 layers, swish, one shared vocabulary of 58101),
random weights, save_pretrained;
its tokenizer: unigram sentencepiece models trained on Multi30k's train (English and
German, --pieces each: a 58k-piece model cannot be learned from 29k sentences), their
pieces in one vocab.json padded with unused pieces to 58101 ids (so the embedding and
the output layer have opus-mt-en-de's size). Then import_model.py into FOLDER_workdir.
On the first --sentences of test 2016, beam 4 with the length rule both have (sum of
log-probabilities: length_penalty 0 there, --alpha=0 --eos_within_beam here; longest
output source tokens + --max_extra, only EOS there, scored by its log-probability:
tests/fixtures/make_pretrained.py's `eos_at_limit` in generate), alternating rounds of:
- decode.py, one process launch as a user runs it (load, compile, translate; its own
  compilation cache, fresh per bench run: round 1 compiles, later rounds read it);
- Translator.translate in a process kept alive, after a warm-up call (steady state);
- transformers' generate in this process (model loaded once), sources grouped by
  equal token length (so that each gets its own length limit), at most --batch a call.
torch on 2 threads; jax as decode.py sets it (one CPU device per core, 2).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean, median

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (stdlib only: importable under any Python)

VOCAB = 58101  # opus-mt-en-de's vocab_size.


def sources(count: int) -> list[str]:
  """The first `count` sources of test 2016."""
  with gzip.open(common.MULTI30K / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
    return f.read().splitlines()[:count]


def translator_stage(workdir: str, count: int, max_extra: int) -> None:
  """Under the project's Python: a Translator that warms up (its outputs: RESULT line),
  then translates the sentences once per line read from stdin, answering 'done'."""
  from flax_transformer.cli import common as cli

  cli.set_cpu_devices(0)  # As decode.py: one device per core.
  from flax_transformer import compilation, provenance
  from flax_transformer.translation.search_config import SearchConfig
  from flax_transformer.translation.translator import Translator

  code = provenance.commit()  # At the start: nothing the run writes is in it.
  compilation.set_default_xla_flags()
  search = SearchConfig(beam_size=4, alpha=0.0, max_extra=max_extra, eos_within_beam=True)
  translator = Translator.from_workdir(workdir, search=search)
  texts = sources(count)
  ids = translator.translate_nbest_ids([translator.tokenizer.source.tokenize(s) for s in texts])
  print("RESULT " + json.dumps({"pieces": [translator.tokenizer.target.pieces(h[0][0])
                                           for h in ids], "texts": translator.translate(texts),
                                "machine": common.machine(), **code}),
        flush=True)
  for _ in sys.stdin:
    translator.translate(texts)
    print("done", flush=True)


def make_model(folder: Path, pieces: int) -> None:
  """The random OPUS-MT-shaped MarianMTModel and its tokenizer files in `folder`."""
  sys.path.insert(0, str(common.ROOT / "tests" / "fixtures"))
  import torch
  from make_pretrained import lines, marian_vocab, train_spm
  from transformers import MarianConfig, MarianMTModel, MarianTokenizer

  torch.manual_seed(0)
  folder.mkdir(parents=True)
  with tempfile.TemporaryDirectory() as tmp:
    spms = [train_spm(lines("train", lang, 29000), Path(tmp, f"{side}.spm"), pieces)
            for lang, side in (("en", "source"), ("de", "target"))]
    vocab = list(marian_vocab(*spms))[:-1]  # '<pad>' last again below.
    vocab += [f"<unused_{i}>" for i in range(VOCAB - 1 - len(vocab))] + ["<pad>"]
    Path(tmp, "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(vocab)}))
    MarianTokenizer(vocab=f"{tmp}/vocab.json", source_spm=f"{tmp}/source.spm",
                    target_spm=f"{tmp}/target.spm", source_lang="en",
                    target_lang="de").save_pretrained(folder)
  config = MarianConfig(  # opus-mt-en-de's config.json, less its generate settings.
      vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=512, encoder_layers=6,
      decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
      encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
      activation_function="swish", scale_embedding=True, pad_token_id=VOCAB - 1,
      eos_token_id=0, decoder_start_token_id=VOCAB - 1, forced_eos_token_id=0)
  MarianMTModel(config).save_pretrained(folder, safe_serialization=True)


def main() -> None:
  parser = common.parser(__doc__)
  parser.add_argument("--folder", required=True, help="the model (made here if absent)")
  parser.add_argument("--sentences", type=int, default=1000)
  parser.add_argument("--max_extra", type=int, default=20)  # make_pretrained.py's MAX_EXTRA.
  parser.add_argument("--pieces", type=int, default=6000)
  parser.add_argument("--batch", type=int, default=64, help="generate: sentences a call")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--python", default=str(common.ROOT / ".venv" / "bin" / "python"))
  parser.add_argument("--translator", help=argparse.SUPPRESS)  # Its stage.
  args = parser.parse_args()
  if args.translator:
    return translator_stage(args.translator, args.sentences, args.max_extra)
  load_start = os.getloadavg()
  folder, workdir = Path(args.folder), Path(f"{args.folder}_workdir")
  if not folder.exists():
    make_model(folder, args.pieces)
  if not workdir.exists():
    common.run_script(args.python, "import_model.py", f"--from={folder}", f"--workdir={workdir}")
  import torch
  import transformers
  sys.path.insert(0, str(common.ROOT / "tests" / "fixtures"))
  from make_pretrained import generation_kwargs
  from transformers import MarianMTModel, MarianTokenizer

  torch.set_num_threads(2)
  torch.set_grad_enabled(False)
  model = MarianMTModel.from_pretrained(folder).eval()
  tokenizer = MarianTokenizer.from_pretrained(folder)
  texts = sources(args.sentences)
  by_length = {}
  for i, text in enumerate(texts):
    by_length.setdefault(len(tokenizer(text)["input_ids"]), []).append(i)
  calls = [group[start:start + args.batch] for group in by_length.values()
           for start in range(0, len(group), args.batch)]
  pieces = [None] * len(texts)

  def transformers_generate() -> None:
    for call in calls:
      batch = tokenizer([texts[i] for i in call], return_tensors="pt")
      kwargs = {**generation_kwargs(model, batch["input_ids"][0], 4, 0, args.max_extra),
                "return_dict_in_generate": False, "output_scores": False}
      for i, out in zip(call, model.generate(**batch, **kwargs)):
        pieces[i] = [p for p in tokenizer.convert_ids_to_tokens(out[1:]) if p != "<pad>"]
        pieces[i] = pieces[i][:-1] if pieces[i][-1:] == ["</s>"] else pieces[i]  # As ours.

  tmp = Path(tempfile.mkdtemp(prefix="pretrained_speed_"))
  (tmp / "src.en").write_text("".join(t + "\n" for t in texts))
  child = subprocess.Popen([args.python, __file__, f"--folder={folder}",
                            f"--translator={workdir}",
                            f"--sentences={args.sentences}", f"--max_extra={args.max_extra}"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           cwd=common.ROOT)
  ours = next((json.loads(line[7:]) for line in child.stdout if line.startswith("RESULT ")),
              None) or sys.exit("the Translator stage failed")

  def translator() -> None:
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "done"

  decode_command = [
      "decode.py", f"--workdir={workdir}", f"--input={tmp / 'src.en'}",
      f"--output={tmp / 'out.de'}", "--beam_size=4", "--alpha=0", "--eos_within_beam",
      f"--max_extra={args.max_extra}", "--average_last=1", "--nointeractive",
      f"--compilation_cache_dir={tmp / 'cache'}"]
  times = common.alternating({"decode.py": lambda: common.run_script(args.python, *decode_command),
                              "Translator": translator,
                              "transformers": transformers_generate}, args.rounds)
  child.stdin.close()
  child.wait()
  ours_lengths = [len(p) + 1 for p in ours["pieces"]]  # EOS included, as generate's.
  rows = [{"engine": name, "seconds": seconds, "median_s": median(seconds),
           "sentences_per_s": len(texts) / median(seconds)} for name, seconds in times.items()]
  for row in rows:
    row["vs_transformers"] = row["sentences_per_s"] / rows[-1]["sentences_per_s"]
  record = {
      "command": common.bench_command(), "git_commit": ours["git_commit"],
      "git_dirty": ours["git_dirty"], "folder": str(folder), "sentences": len(texts),
      "data": "Multi30k test 2016 (EN->DE), first lines", "max_extra": args.max_extra,
      "spm_pieces": args.pieces,
      "beam": 4, "rows": rows, "generate_calls": len(calls),
      "mean_output_tokens": {"ours": mean(ours_lengths),
                             "transformers": mean(len(p) + 1 for p in pieces)},
      "identical_outputs": sum(a == b for a, b in zip(ours["pieces"], pieces)),
      "decode_py_lines_equal_translator": sum(a == b for a, b in zip(
          (tmp / "out.de").read_text().splitlines(), ours["texts"])),
      "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
      "torch_threads": torch.get_num_threads(), "machine": ours["machine"],
      "load_average": {"start": load_start, "end": os.getloadavg()}}
  print(json.dumps({k: v for k, v in record.items() if k != "machine"}, indent=1))
  common.write_json(args.json, record)


if __name__ == "__main__":
  main()
