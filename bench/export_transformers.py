"""transformers' MarianMTModel and CTranslate2's converter on a model exported here.

  python bench/export_transformers.py --workdir=W \\
      --json=results/bench/export_transformers.json

Runs under a Python with torch, transformers, sentencepiece and ctranslate2 (pip install
torch transformers sentencepiece ctranslate2; never the project's venv, whose suite must
not need them); the project's own Python (--python) runs export.py, decode.py and our
model's logits. On the first --sentences of Multi30k's test 2016:
- export.py --format=transformers, loaded by MarianMTModel and MarianTokenizer;
- token ids: MarianTokenizer's (mapped back through vocab.json) against ours;
- greedy: transformers' generate (num_beams=1, the longest output our search allows:
  source tokens + max_extra, at most max_len, EOS forced there) against decode.py
  --beam_size=1, line for line; beam 4 too, at the length rule both have (the sum of
  log-probabilities: length_penalty=0 there, --alpha=0 --eos_within_beam here);
- scores: transformers' summed log-probabilities of the references against decode.py
  --score (both natural log, EOS included);
- logits: the largest |difference| from ours, teacher-forced on the references, as
  loaded (LayerNorm epsilon 1e-5) and with our epsilon put into transformers' norms
  (what the reparametrization leaves: float rounding);
- CTranslate2: ct2-transformers-converter on the folder against export.py
  --format=ctranslate2, greedy and beam 4, the same options, and its greedy output
  against decode.py's. The converter starts the decoder from a zero vector: a model
  trained with --config.model.start_from_zero_embedding=True is what it converts;
  for one without, transformers with the start token's row zeroed is compared too.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (stdlib only: importable under any Python)

MAX_EXTRA = 50  # decode.py's default.


def read_lines(name: str, count: int) -> list[str]:
  with gzip.open(common.MULTI30K / name, "rt", encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f][:count]


def ours(workdir: str, pairs_file: str, logits_file: str) -> None:
  """Under the project's Python: our tokens and teacher-forced logits of each pair
  (the checkpoints decode.py averages), and where they came from: RESULT line."""
  import jax
  import numpy as np

  from flax_transformer import Transformer, provenance
  from flax_transformer.translation.translator import Translator

  translator = Translator.from_workdir(workdir, devices=jax.devices()[:1],
                                       average_last=5)  # As decode.py and export.py.
  config, params = translator.member(0)
  model = Transformer(config.replace(deterministic=True))
  apply = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y))
  pairs = json.loads(Path(pairs_file).read_text())
  tokens, logits = [], {}
  for i, (source, target) in enumerate(pairs):
    x, y = (translator.tokenizer.tokenize(s) for s in (source, target))
    tokens.append([x.tolist(), y.tolist()])
    logits[f"pair_{i}"] = np.asarray(apply(params, x[None], y[None])[0])
  np.savez(logits_file, **logits)
  print("RESULT " + json.dumps({"tokens": tokens, "layer_norm_epsilon":
                                config.layer_norm_epsilon, "max_len": config.max_len,
                                "start_from_zero_embedding": config.start_from_zero_embedding,
                                "checkpoint_steps": list(translator.checkpoint_steps[0]),
                                "model": {k: v for k, v in config.to_dict().items()
                                          if k in ("d_model", "num_layers", "vocab_size")},
                                **provenance.commit()}))


def main() -> None:
  parser = common.parser(__doc__)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--sentences", type=int, default=50)
  parser.add_argument("--python", default=str(common.ROOT / ".venv" / "bin" / "python"),
                      help="the project's Python (export.py, decode.py, our logits)")
  parser.add_argument("--ours", nargs=2, help=argparse.SUPPRESS)  # The project's stage.
  args = parser.parse_args()
  if args.ours:
    return ours(args.workdir, *args.ours)
  import ctranslate2
  import numpy as np
  import sentencepiece as spm
  import torch
  import transformers
  from transformers import MarianMTModel, MarianTokenizer

  torch.set_grad_enabled(False)
  sources = read_lines("test_2016_flickr.en.gz", args.sentences)
  references = read_lines("test_2016_flickr.de.gz", args.sentences)
  tmp = Path(tempfile.mkdtemp(prefix="export_transformers_"))
  (tmp / "src.en").write_text("".join(s + "\n" for s in sources))
  (tmp / "ref.de").write_text("".join(s + "\n" for s in references))
  (tmp / "pairs.json").write_text(json.dumps(list(zip(sources, references))))
  hf, ct2_ours, ct2_theirs = tmp / "hf", tmp / "ct2", tmp / "ct2_converted"
  run = functools.partial(common.run_script, args.python)
  source = f"--input={tmp / 'src.en'}"
  export_log = run("export.py", f"--workdir={args.workdir}", f"--out={hf}",
                   "--format=transformers")
  run("export.py", f"--workdir={args.workdir}", f"--out={ct2_ours}", "--format=ctranslate2")
  run("decode.py", f"--workdir={args.workdir}", source, f"--output={tmp / 'greedy.de'}",
      "--beam_size=1", f"--max_extra={MAX_EXTRA}", "--nointeractive")
  # Beam 4 at the length rule both have: the sum of log-probabilities (alpha 0 here,
  # length_penalty 0 there), a hypothesis ending only among a step's best beam_size.
  run("decode.py", f"--workdir={args.workdir}", source, f"--output={tmp / 'beam.de'}",
      "--beam_size=4", "--alpha=0", "--eos_within_beam", f"--max_extra={MAX_EXTRA}",
      "--nointeractive")
  run("decode.py", f"--workdir={args.workdir}", source, f"--score={tmp / 'ref.de'}",
      f"--output={tmp / 'scores.tsv'}", "--nointeractive")
  mine = common.run_child([args.python, __file__, f"--workdir={args.workdir}", "--ours",
                           str(tmp / "pairs.json"), str(tmp / "logits.npz")], "our logits")
  our_greedy = (tmp / "greedy.de").read_text().splitlines()
  our_beam = (tmp / "beam.de").read_text().splitlines()
  our_scores = [float(line.split("\t")[0])
                for line in (tmp / "scores.tsv").read_text().splitlines()]

  model = MarianMTModel.from_pretrained(hf).eval()
  tokenizer = MarianTokenizer.from_pretrained(hf)
  # Marian's ids -> ours, through the exported vocab.json and our sentencepiece model.
  sp = spm.SentencePieceProcessor(model_file=str(hf / "source.spm"))
  vocab = json.loads((hf / "vocab.json").read_text())
  to_ours = np.zeros(len(vocab), np.int64)
  for piece, theirs in vocab.items():
    to_ours[theirs] = sp.piece_to_id(piece)
  from_ours = np.argsort(to_ours)

  inputs = [tokenizer(s, return_tensors="pt")["input_ids"] for s in sources]
  # The longest output our search allows each source (EOS included).
  longest = [min(x.shape[1] + MAX_EXTRA, mine["max_len"]) for x in inputs]

  def greedy(beams: int = 1) -> list[str]:
    return [tokenizer.decode(model.generate(input_ids=x, num_beams=beams, do_sample=False,
                                            length_penalty=0.0, early_stopping=False,
                                            max_length=n + 1)[0],  # The start token first.
                             skip_special_tokens=True) for x, n in zip(inputs, longest)]

  same_tokens, scores, logit_diff = 0, [], {"loaded": 0.0, "our_epsilon": 0.0}
  norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
  with np.load(tmp / "logits.npz") as our_logits:
    for i, (x, reference) in enumerate(zip(inputs, references)):
      y = tokenizer(text_target=reference, return_tensors="pt")["input_ids"]
      same_tokens += [to_ours[x[0].numpy()].tolist(), to_ours[y[0].numpy()].tolist()] == \
          mine["tokens"][i]
      for key, eps in (("our_epsilon", mine["layer_norm_epsilon"]), ("loaded", 1e-5)):
        for norm in norms:
          norm.eps = eps
        logits = model(input_ids=x, labels=y).logits[0]  # Loaded: the last, kept.
        logit_diff[key] = max(logit_diff[key], float(np.abs(
            logits.numpy()[:, from_ours] - our_logits[f"pair_{i}"]).max()))
      log_probs = torch.log_softmax(logits, -1)
      scores.append(float(log_probs.gather(1, y[0][:, None]).sum()))
  transformers_greedy, transformers_beam = greedy(), greedy(beams=4)

  def transformers_score(x, text: str) -> float:
    y = tokenizer(text_target=text, return_tensors="pt")["input_ids"]
    log_probs = torch.log_softmax(model(input_ids=x, labels=y).logits[0], -1)
    return float(log_probs.gather(1, y[0][:, None]).sum())

  # Where the beams differ: both hypotheses scored by both models (a near tie, or not).
  beam_differing = []
  for i, (a, b) in enumerate(zip(our_beam, transformers_beam)):
    if a != b:
      (tmp / "one.en").write_text(sources[i] + "\n" + sources[i] + "\n")
      (tmp / "two.de").write_text(a + "\n" + b + "\n")
      run("decode.py", f"--workdir={args.workdir}", f"--input={tmp / 'one.en'}",
          f"--score={tmp / 'two.de'}", f"--output={tmp / 'two.tsv'}", "--nointeractive")
      ours_scores = [float(line.split("\t")[0])
                     for line in (tmp / "two.tsv").read_text().splitlines()]
      beam_differing.append({"line": i + 1, "ours": a, "transformers": b,
                             "scores_by_ours": ours_scores,
                             "scores_by_transformers": [transformers_score(inputs[i], t)
                                                        for t in (a, b)]})

  def ct2_translate(folder: Path, beam: int, pad: bool) -> list[str]:
    """CTranslate2's best translation of each source, searched as our Ct2Runner does
    (the same longest output, padding never emitted; the converter drops it)."""
    translator = ctranslate2.Translator(str(folder), device="cpu")
    return [sp.decode_pieces(translator.translate_batch(
        [tokenizer.convert_ids_to_tokens(x[0])], beam_size=beam, max_decoding_length=n - 1,
        suppress_sequences=[["<pad>"]] if pad else None)[0].hypotheses[0])
        for x, n in zip(inputs, longest)]

  ct2 = {"converter": "ctranslate2.converters.TransformersConverter (ct2-transformers-converter)"}
  try:
    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(ct2_theirs))
    ct2["converter_accepts"] = True
  except Exception as e:  # What it says is the finding.
    ct2.update(converter_accepts=False, converter_error=f"{type(e).__name__}: {e}")
  if ct2["converter_accepts"]:
    for beam in (1, 4):
      theirs = ct2_translate(ct2_theirs, beam, pad=False)
      ct2[f"beam_{beam}_equal_lines"] = sum(
          a == b for a, b in zip(ct2_translate(ct2_ours, beam, pad=True), theirs))
      if beam == 1:
        converted_greedy = theirs
    ct2["greedy_equal_lines_to_decode_py"] = sum(
        a == b for a, b in zip(converted_greedy, our_greedy))
    if not mine["start_from_zero_embedding"]:
      # The converter starts the decoder from zeros, where this model embeds its start
      # token: transformers started so (the row zeroed; padding is never emitted, so its
      # logit is moot) against it.
      start = model.get_decoder().embed_tokens.weight[model.config.decoder_start_token_id]
      start.zero_()
      ct2["greedy_equal_lines_to_transformers_with_zero_start"] = sum(
          a == b for a, b in zip(greedy(), converted_greedy))
  score_diff = [abs(a - b) for a, b in zip(scores, our_scores)]
  record = {
      "command": common.bench_command(), "workdir": args.workdir, "sentences": len(sources),
      "data": "Multi30k test 2016 (EN->DE), first lines",
      **{k: v for k, v in mine.items() if k != "tokens"},
      "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                   "ctranslate2": ctranslate2.__version__},
      "export_warning": [line.split("] ", 1)[-1] for line in export_log.splitlines()
                         if line.startswith("W") and "marian.py" in line],
      "token_ids_equal": same_tokens,
      "greedy_equal_lines": sum(a == b for a, b in zip(transformers_greedy, our_greedy)),
      "greedy_differing": [{"line": i + 1, "ours": a, "transformers": b} for i, (a, b)
                           in enumerate(zip(our_greedy, transformers_greedy)) if a != b],
      "beam_4_alpha_0_equal_lines": sum(a == b for a, b in zip(transformers_beam, our_beam)),
      "beam_4_differing": beam_differing,
      "score_max_abs_diff": max(score_diff),
      "score_mean_abs_diff": sum(score_diff) / len(score_diff),
      "scores_within_0_001": sum(d <= 1e-3 for d in score_diff),
      "logit_max_abs_diff": logit_diff,
      "ctranslate2": ct2,
  }
  print(json.dumps({k: v for k, v in record.items() if not k.endswith("_differing")}, indent=1))
  common.write_json(args.json, record)


if __name__ == "__main__":
  main()
