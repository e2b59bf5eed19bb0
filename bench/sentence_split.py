"""Sentence splitters for serve.py's long texts (issue 78): boundary accuracy and speed.

  python bench/sentence_split.py --json=results/bench/sentence_split.json

Paragraphs with known sentences, in English, German and French:
- Multi30k-like: --paragraphs paragraphs of 3-6 consecutive test 2016 captions each, joined
  by one space (the captions are the sentences; a few lack a final period, as captions do);
- news-like: hand-written paragraphs with abbreviations (Dr., U.S., z. B., M.), numbers
  (3.5, 1.200, 10 a.m.), quotes, parentheses and a question.
Each splitter (pysbd, sentencex, minisbd when its models can be had) splits each paragraph;
a boundary is the character offset where a sentence starts (whitespace stripped).
Reported per splitter, language and kind: boundary precision, recall, F1, the share of
paragraphs split exactly right, and microseconds per paragraph (best of --rounds).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

NEWS = {
    "en": [
        ["Dr. Smith arrived in Washington on Monday at 10 a.m. local time.",
         "The U.S. economy grew by 3.5 percent last year, according to the report.",
         "\"We are very pleased,\" she said.", "Will the growth last?",
         "Analysts at J.P. Morgan expect 2.1 percent in 2025."],
        ["The museum (opened in 1998) has 1,200 paintings.",
         "Its director, Mr. Brown, said: \"Visitors are back.\"",
         "Tickets cost $12.50 for adults, e.g. for groups of four or more."],
        ["Storms hit the coast overnight.", "About 40,000 homes lost power!",
         "Officials said roads near St. Louis would reopen by 6 p.m. on Tuesday."],
    ],
    "de": [
        ["Dr. Müller kam am 3. Mai nach Berlin.",
         "Die Wirtschaft wuchs im vergangenen Jahr um 3,5 Prozent, z. B. im Bau.",
         "„Wir sind sehr zufrieden“, sagte sie.", "Wird das Wachstum anhalten?",
         "Die Stadt hat ca. 1.200 Einwohner mehr als 2019."],
        ["Das Museum (eröffnet 1998) zeigt u. a. Werke von A. Dürer.",
         "Der Eintritt kostet 12,50 Euro.", "Kinder bis 6 Jahre zahlen nichts!"],
        ["In der Nacht tobten Stürme an der Küste.",
         "Rund 40.000 Haushalte waren bis zum 2. Juni ohne Strom.",
         "Die B 96 bleibt bis Dienstag, 18 Uhr, gesperrt."],
    ],
    "fr": [
        ["M. Dupont est arrivé à Paris lundi à 10 h.",
         "L'économie a progressé de 3,5 % l'an dernier, selon le rapport.",
         "« Nous sommes très satisfaits », a-t-elle déclaré.", "La croissance va-t-elle durer ?",
         "Les analystes de la S.N.C.F. prévoient 2,1 % en 2025."],
        ["Le musée (ouvert en 1998) compte 1 200 tableaux.",
         "Son directeur, Mme Martin, a dit : « Les visiteurs reviennent. »",
         "Le billet coûte 12,50 euros, p. ex. pour les groupes."],
        ["Des tempêtes ont frappé la côte cette nuit.",
         "Environ 40 000 foyers ont été privés d'électricité !",
         "Les routes près de St. Malo rouvriront mardi vers 18 h."],
    ],
}


def multi30k(folder: Path, language: str, paragraphs: int, seed: int) -> list[list[str]]:
  with gzip.open(folder / f"test_2016_flickr.{language}.gz", "rt", encoding="utf-8") as f:
    captions = [line.strip() for line in f]
  rng, out, start = random.Random(seed), [], 0
  while len(out) < paragraphs and start < len(captions):
    size = rng.randint(3, 6)
    out.append(captions[start:start + size])
    start += size
  return out


def boundaries(sentences: list[str], text: str) -> set[int]:
  """Where each sentence but the first starts in `text`, non-space characters counted."""
  starts, at = set(), 0
  for sentence in sentences:
    stripped = "".join(sentence.split())
    if at:
      starts.add(at)
    at += len(stripped)
  assert at == len("".join(text.split())), "a splitter lost or added text"
  return starts


def splitters() -> dict:
  found = {}
  try:
    import pysbd
    segmenters = {}

    def by_pysbd(language, text):
      if language not in segmenters:
        segmenters[language] = pysbd.Segmenter(language=language, clean=False)
      return segmenters[language].segment(text)
    found["pysbd " + importlib.metadata.version("pysbd")] = by_pysbd
  except ImportError as e:
    print(f"pysbd: {e}")
  try:
    import sentencex
    found["sentencex " + importlib.metadata.version("sentencex")] = (
        lambda language, text: list(sentencex.segment(language, text)))
  except ImportError as e:
    print(f"sentencex: {e}")
  try:  # LibreTranslate's own (its models come from GitHub releases on first use).
    import minisbd
    detectors = {language: minisbd.SBDetect(language) for language in NEWS}
    found["minisbd " + importlib.metadata.version("minisbd")] = (
        lambda language, text: detectors[language].sentences(text))
  except Exception as e:  # noqa: BLE001 - no network for its models: recorded, not measured.
    print(f"minisbd: not measured: {type(e).__name__}: {str(e)[:200]}")
    found["minisbd"] = f"not measured: {type(e).__name__}: {str(e)[:200]}"
  return found


def measure(split, language: str, paragraphs: list[list[str]], rounds: int) -> dict:
  texts = [" ".join(p) for p in paragraphs]
  best = float("inf")
  for _ in range(rounds):
    start = time.perf_counter()
    found = [split(language, text) for text in texts]
    best = min(best, time.perf_counter() - start)
  hits = wanted = got = exact = 0
  for gold, text, pieces in zip(paragraphs, texts, found):
    truth, guess = boundaries(gold, text), boundaries(pieces, text)
    hits, wanted, got = hits + len(truth & guess), wanted + len(truth), got + len(guess)
    exact += truth == guess
  precision, recall = hits / max(got, 1), hits / max(wanted, 1)
  return {"paragraphs": len(texts), "sentences": sum(map(len, paragraphs)),
          "precision": round(precision, 4), "recall": round(recall, 4),
          "f1": round(2 * precision * recall / max(precision + recall, 1e-9), 4),
          "exact": round(exact / len(texts), 4), "us_per_paragraph": round(best / len(texts) * 1e6, 1)}


def main() -> None:
  parser = common.parser(__doc__)
  parser.add_argument("--multi30k", default=str(common.MULTI30K))
  parser.add_argument("--paragraphs", type=int, default=200)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  rows, unavailable = [], {}
  for name, split in splitters().items():
    if isinstance(split, str):
      unavailable[name] = split
      continue
    for language, news in NEWS.items():
      data = {"multi30k": multi30k(Path(args.multi30k), language, args.paragraphs, args.seed),
              "news": news}
      for kind, paragraphs in data.items():
        rows.append({"splitter": name, "language": language, "kind": kind,
                     **measure(split, language, paragraphs, args.rounds)})
  common.print_table(rows, ["splitter", "language", "kind", "paragraphs", "precision", "recall",
                            "f1", "exact", "us_per_paragraph"])
  common.write_json(args.json, {"command": common.bench_command(), "machine": common.machine(),
                                "rows": rows, "unavailable": unavailable})


if __name__ == "__main__":
  main()
