"""Test-set scores of a trained Multi30k workdir, as results/runs/NAME/NAME.json.

python -m tools.results --workdir DIR [--ensemble DIR2,DIR3] [--average_last K]
    [--beam_size 4 --alpha 0.6] [--command CMD ...] [--out results/runs/NAME/NAME.json]
    [--source_lang de --target_lang fr]
Decodes test_2016_flickr with beam 4, alpha 0.6 (the paper's search; another one only once
chosen on validation), averaging the last checkpoints: sacreBLEU (cased, detokenized, with
signature), lowercased BLEU, chrF; from the run's metrics.jsonl the training wall time,
steps and the wall time at which validation BLEU (and test BLEU, when logged with
--config.test_bleu_every_steps) first reached 30 and 35. With --ensemble, the models of all
workdirs vote (decode.py --ensemble); steps and train_wall_s are then the members' totals,
`members` lists each, and the curves are --workdir's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from flax_transformer.cli.flags import AVERAGE_LAST_HELP
from tools.common import MULTI30K, print_table, write_json


def flags() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--workdir", required=True, help="a trained Multi30k workdir")
  parser.add_argument("--ensemble", default="",
                      help="comma-separated workdirs whose models vote with --workdir's")
  parser.add_argument("--average_last", type=int, default=None, help=AVERAGE_LAST_HELP)
  parser.add_argument("--beam_size", type=int, default=4, help="beam width")
  parser.add_argument("--alpha", type=float, default=0.6,
                      help="length penalty exponent, ((5 + length) / 6) ** alpha")
  parser.add_argument("--command", action="append", default=[],
                      help="the training command, for the record (with --ensemble: once per "
                           "workdir, --workdir's first)")
  parser.add_argument("--train_commit", default="",
                      help="the training run's git commit, for runs whose run.json predates "
                           "its launch records")
  parser.add_argument("--source_lang", default="",
                      help="a multilingual model's direction to score (with --target_lang; "
                           "default: the run's own pair)")
  parser.add_argument("--target_lang", default="", help="see --source_lang")
  parser.add_argument("--out", help="write the results JSON here (and its hypotheses beside "
                                    "it, as .hyp)")
  return parser


def main():
  args = flags().parse_args()
  import jax

  from flax_transformer import provenance
  from flax_transformer.cli.translate import score
  from flax_transformer.data.sources import read_lines
  from flax_transformer.training.metrics import read_metrics
  from flax_transformer.translation.search_config import SearchConfig
  from flax_transformer.translation.translator import Translator

  ensemble = [w for w in args.ensemble.split(",") if w]
  workdirs = [args.workdir, *ensemble]
  run = json.loads((Path(args.workdir) / "run.json").read_text())
  all_records = [read_metrics(w) for w in workdirs]
  records = all_records[0]
  launches = run.get("launches", [])
  # The command as train.py recorded it at its first launch, unless one is given.
  recorded = shlex.join(["python", *launches[0]["argv"]]) if (
      launches and launches[0].get("argv")) else ""
  command = args.command[0] if args.command else recorded
  training = _training_record(launches, command, args.train_commit)
  src, tgt = (args.source_lang, args.target_lang) if args.target_lang else _languages(training)
  direction = dict(source_lang=src, target_lang=tgt) if args.target_lang else {}
  bleu_key = f"bleu_{src}-{tgt}" if direction else "bleu"  # a multilingual run's, per direction
  sources, references = (read_lines(MULTI30K / f"test_2016_flickr.{lang}.gz")
                         for lang in (src, tgt))
  search_config = SearchConfig(beam_size=args.beam_size, alpha=args.alpha)
  translator = Translator.from_workdir(args.workdir, search=search_config, ensemble=ensemble,
                                       average_last=args.average_last)
  start = time.time()
  hypotheses = translator.translate(sources, **direction)
  decode_s = time.time() - start
  # decode.py's scores (cased and lowercased, detokenized) and signatures.
  (_, bleu, bleu_signature), (_, bleu_lowercase, _), (_, chrf, chrf_signature) = score(
      hypotheses, references, ["bleu", "chrf"])
  result = {
      "pair": f"{src}-{tgt}", "split": "test_2016_flickr",
      "bleu": bleu, "bleu_signature": bleu_signature,
      "bleu_lowercase": bleu_lowercase,
      "chrf": chrf, "chrf_signature": chrf_signature,
      "steps": sum(r[-1]["step"] for r in all_records),
      "train_wall_s": sum(r[-1]["wall_s"] for r in all_records),
      # One model: its averaged steps; an ensemble: per member.
      "averaged_checkpoints": (list(translator.checkpoint_steps) if ensemble
                               else translator.checkpoint_steps[0]), "decode_s": decode_s,
      "beam_size": args.beam_size, "alpha": args.alpha,
      "validation_bleu_curve": _curve(records, bleu_key),
      "model": run["model"], "command": command, **training,
      "decoded_by": provenance.describe(jax.devices()),
  }
  if ensemble:
    result["members"] = _members(workdirs, all_records, translator.checkpoint_steps, args.command)
  result.update(_time_to_bleu(records, bleu_key))
  _report(args, result, hypotheses, len(workdirs) if ensemble else 0)


def _members(workdirs: list[str], all_records: list[list[dict]], steps, commands: list[str]
             ) -> list[dict]:
  """An ensemble's members: each workdir's steps, wall time, dropout, averaged checkpoints
  and training command (--command, in --workdir, --ensemble order; '' when not given)."""
  commands = commands + [""] * (len(workdirs) - len(commands))
  return [{"workdir": w, "steps": r[-1]["step"], "train_wall_s": r[-1]["wall_s"],
           "dropout_rate": json.loads((Path(w) / "run.json").read_text())["model"]["dropout_rate"],
           "averaged_checkpoints": s, "command": c}
          for w, r, s, c in zip(workdirs, all_records, steps, commands)]


def _curve(records: list[dict], key: str) -> list[tuple]:
  """(step, wall seconds, validation BLEU) where `key` (a multilingual run's per-direction
  BLEU, bleu_de-fr, or the run's own) was logged."""
  return [(r["step"], round(r["wall_s"]), round(r[key], 2)) for r in records if key in r]


def _time_to_bleu(records: list[dict], bleu_key: str = "bleu") -> dict:
  """The wall time and step at which validation (and test, when logged) BLEU first reached
  30 and 35, and the test BLEU curve when there is one."""
  out = {}
  for target in (30, 35):
    for key, name in ((bleu_key, "validation"), ("test_bleu", "test")):
      hit = next((r for r in records if r.get(key, 0) >= target), None)
      out[f"wall_s_to_{name}_bleu_{target}"] = hit["wall_s"] if hit else None
      out[f"step_to_{name}_bleu_{target}"] = hit["step"] if hit else None
  if any("test_bleu" in r for r in records):
    out["test_bleu_curve"] = [(r["step"], round(r["wall_s"]), round(r["test_bleu"], 2))
                              for r in records if "test_bleu" in r]
  return out


def _report(args, result: dict, hypotheses: list[str], members: int) -> None:
  """Prints the scores; writes the hypotheses into the workdir (and beside --out) and the
  record to --out."""
  print_table([result], ["pair", "bleu", "bleu_lowercase", "chrf", "steps", "train_wall_s",
                         "wall_s_to_validation_bleu_30", "wall_s_to_validation_bleu_35",
                         "wall_s_to_test_bleu_30", "wall_s_to_test_bleu_35"])
  print(result["bleu_signature"])
  search = "" if (args.beam_size, args.alpha) == (4, 0.6) else f".b{args.beam_size}.a{args.alpha}"
  search += f".ensemble{members}" if members else ""
  search = f".{result['pair']}{search}" if args.target_lang else search
  text = "\n".join(hypotheses) + "\n"
  Path(args.workdir, f"test_2016_flickr{search}.hyp").write_text(text)
  if args.out:  # Beside the JSON, to be committed: anyone can re-score it with sacrebleu.
    hyp = Path(args.out).with_suffix(".hyp")
    hyp.parent.mkdir(parents=True, exist_ok=True)
    hyp.write_text(text)
    result["hypotheses_file"] = str(hyp)
  write_json(args.out, result)


def _training_record(launches: list[dict], command: str, commit: str) -> dict:
  """config_file, overrides (a mapping), commit and launches of the training run.

  From run.json's `launches` (train.py records every start); for runs older than
  that record, from the --command given (and --train_commit).
  """
  if launches:
    first = launches[0]
    return {"config_file": first.get("config_file"), "overrides": first.get("overrides", {}),
            "git_commit": first.get("git_commit"), "training_launches": launches}
  config_file, overrides = None, {}
  for part in shlex.split(command):
    if part.startswith("--config="):
      config_file = part.split("=", 1)[1]
    elif part.startswith("--config."):
      key, value = part[len("--config."):].split("=", 1)
      overrides[key] = value
  return {"config_file": config_file, "overrides": overrides, "git_commit": commit or None}


def _languages(training: dict) -> tuple[str, str]:
  """Source and target languages of the training run (default EN->DE)."""
  launches = training.get("training_launches") or [{}]
  config = launches[0].get("config", {})
  source = config.get("source_lang") or training["overrides"].get("source_lang", "en")
  target = config.get("target_lang") or training["overrides"].get("target_lang", "de")
  return source, target


if __name__ == "__main__":
  main()
