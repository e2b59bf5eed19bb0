"""Every number in the docs (render_docs.DOCS) is backed or exempt, so no figure can be
quoted that its files do not say (docs/provenance.md, "The docs check").

python -m tools.check_docs [--root DIR]

tools/render_docs.py renders the figures (tables between `<!-- render: NAME -->` markers,
single figures as `<!--{TEMPLATE}-->TEXT<!--/-->`); this script holds the other side: a
number outside those, a quoted log block (QUOTED_BLOCKS) and the NON_FIGURES, SETTINGS
and PHRASES allow-lists fails. Exit 0 when no number is left over; 1 with one line per
untraced number or misquoted log line; 2 when an allow-listed phrase or block is gone.
"""

from __future__ import annotations

import argparse
import bisect
import re
import sys
from pathlib import Path

from tools import render_docs

# (doc, text just before a fenced log block, file): every line of the block is quoted
# from the file (a log the run wrote).
QUOTED_BLOCKS = [
    ("README.md", "a second launch loads the compiled steps from the cache):",
     "results/runs/multi30k_en-de_paper_exact/train.log"),
]

# (doc, phrase, why its numbers are no figures): settings, the paper's own numbers,
# exit codes and other numbers nothing measured. Each must be in the doc verbatim
# (whitespace aside), so a change to one fails like a changed figure.
PAPER = "the paper's value (SPEC.md)"
SETTING = "a setting, not a measurement"
PHRASES = [
    ("README.md", "(Vaswani et al., 2017)", "the paper's citation"),
    ("README.md", "the 1000 hypotheses", "the test set's size"),
    ("docs/accelerators.md", "jax 0.7.1 to 0.11.x", "versions"),
    ("docs/accelerators.md", "(-1: one per 2 cores, at most 8, on hosts of 8+ cores)",
     "the data_workers setting's meaning"),
    ("docs/decoding.md", "gets a 4xx whose body is", "an HTTP status class"),
    ("docs/decoding.md", "malformed JSON (400), a wrong type or an unknown field (422), more "
     "than `--max_sentences` sentences or one longer than `--max_tokens` (413), an option out "
     "of range (422), a missing or wrong token (401), a body not sent within "
     "`--body_timeout_s` (408)", "serve.py's HTTP status codes"),
    ("docs/training.md", "Exit codes: 0 done (or stopped by a signal, checkpoint saved); 2 bad config, "
     "data, workdir or checkpoints (one line saying what and where); 1 the loss diverged.",
     "exit codes"),
    ("docs/training.md", "its own 1/process_count of the data", "a fraction, not a measurement"),
    ("docs/training.md", "the paper used 37k for WMT14 EN-DE's 4.5M pairs", PAPER),
    ("docs/accelerators.md", "the paper's ~25k", PAPER),
    ("docs/accelerators.md", "The paper trained on 8 GPUs for 100K steps (12 hours on P100s)",
     PAPER),
    ("docs/modules.md", "**The start token is the padding id (0)**", "a token id"),
    ("docs/modules.md", "then EOS (id 1)", "a token id"),
    ("docs/training.md", "(0 = never)", "a setting's meaning"),
    ("docs/decoding.md", "(paper: 5 for base, 20 for big)", PAPER),
    ("docs/decoding.md", "`--nbest` above 1", "a setting's bound"),
    ("docs/decoding.md", "in their ISO 639 form", "a standard's name"),
    ("docs/decoding.md", "`charLimit` (5000)", "serve.py's text limit (a setting)"),
    ("docs/decoding.md", "(1 MiB by default)", "serve.py's --max_body_bytes default (a setting)"),
    ("docs/decoding.md", "the beam widened to N + 1 if narrower; N at most `--max_beam` - 1",
     "the alternatives' bounds"),
    ("docs/provenance.md", "BPE (EN-DE, 37k) / word-piece (EN-FR, 32k)", PAPER),
    ("docs/provenance.md", "base 65M, big 213M", PAPER),
    ("docs/provenance.md", "every Table 3 row and big within 7% of the paper's count",
     "the tolerance tests/test_model.py states"),
    ("docs/provenance.md", "add only 4 x d_model per attention block", "the parameter formula"),
    ("docs/provenance.md", "~25k source and ~25k target tokens", PAPER),
    ("docs/provenance.md", "every 10 minutes, last 5 (base) / 20 (big) averaged", PAPER),
    ("docs/provenance.md", "N(0, d_model^-0.5)", "the initialiser"),
    ("docs/provenance.md", "16-bit random numbers (rate exact to 2^-16)", "the mask's precision"),
    ("docs/provenance.md", "eps/V on every class plus 1-eps on the truth", "the formula"),
    ("README.md", "Apache License 2.0", "the licence's name"),
    ("docs/provenance.md", "the 1/sqrt(d_k) scaling", "the paper's formula"),
    ("docs/provenance.md", "over its budget of 12 minutes", "the suite's budget (issue 59), a target"),
    ("docs/faults.md", "heartbeat timeout (30 s here,", "a setting (training.distributed.HEARTBEAT_TIMEOUT_S)"),
    ("docs/multi_host.md", "gives its peers only 30 s (gloo's", "gloo's connection timeout, a library setting"),
    ("docs/accelerators.md", "`profile_first_step`+1 onwards (default 10,", SETTING),
    ("BENCHMARKS.md", "within 0.5 of the CPU run", "an aim: the issue's target"),
    ("BENCHMARKS.md", "CTranslate2's published 10,991 (fp16, A10G)", "CTranslate2's own figure (its README)"),
    ("docs/training.md", "`lrate = learning_rate * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`",
     "eq. 3"),
    ("docs/pretrained.md", "as transformers 4.57 and 5.24 define them", "versions"),
    ("docs/pretrained.md", "(what transformers 4.3x wrote)", "a version"),
    ("docs/pretrained.md", "in 4.x as in 5.x", "versions"),
    ("docs/pretrained.md", "with a transformers 4.x venv and a 5.x one", "versions"),
    ("docs/pretrained.md", "hub's 2020-21 OPUS-MT uploads", "the years of those uploads"),
    ("docs/pretrained.md", "(`<unk> a </s> b <pad>`: 6 ids)",
     "the example's token count (tests/fixtures/hub/tokenizers_*.json)"),
]


class Doc:
  """A doc's text, and the same with whitespace runs as one space (sentences are found
  there), with the map back to the original offsets."""

  def __init__(self, text: str):
    self.text = text
    parts, offsets = [], []
    for word in re.finditer(r"\S+", text):
      if parts:
        parts.append(" ")
        offsets.append(word.start() - 1)
      parts.append(word.group())
      offsets.extend(range(word.start(), word.end()))
    self.flat, self.offsets = "".join(parts), offsets
    self.covered: list[tuple[int, int]] = []  # Original-text spans of checked figures.

  def cover_flat(self, start: int, end: int) -> None:
    self.covered.append((self.offsets[start], self.offsets[end - 1] + 1))


def check(root: Path, docs: dict[str, Doc]) -> tuple[list[str], list[str]]:
  """(mismatches, missing): quoted log blocks against their files, allow-listed phrases
  present; both mark what they cover in `docs`."""
  mismatches, missing = [], []
  for name, anchor, path in QUOTED_BLOCKS:
    d = docs[name]
    at = d.text.find(anchor)
    fence = re.compile(r"```\n(.*?)```", re.S).search(d.text, max(at, 0))
    if at < 0 or fence is None or not (root / path).is_file():
      missing.append(f"{name}: no log block after {anchor!r}, or no {path}")
      continue
    source = (root / path).read_text()
    for line in filter(str.strip, fence.group(1).splitlines()):
      if line.strip() not in source:
        mismatches.append(f"{name}: the block after {anchor!r} quotes {line.strip()!r}, which "
                          f"is not in {path}")
    d.covered.append(fence.span(1))
  for name, phrase, _ in PHRASES:
    d = docs[name]
    at = d.flat.find(phrase)
    if at < 0:
      missing.append(f"{name}: the non-figure phrase {phrase!r} is gone (a changed setting? "
                     "update PHRASES)")
    while at >= 0:
      d.cover_flat(at, at + len(phrase))
      at = d.flat.find(phrase, at + 1)
  return mismatches, missing


# A number in the docs: digits, with thousands commas or decimals ('1,000', '0.55').
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")
# What is not a figure (nothing measured): each pattern with the reason it is exempt.
NON_FIGURES = [
    (r"```(?:bash|python|sh)\n.*?```", "a command or code block"),
    (r"`[^`\n]+`", "code: a command, flag, file name or config value"),
    (r"\]\([^)\s]+\)", "a link target"),
    (r"\b\d{4}-\d{2}-\d{2}(?:[T ][\d:.]+)?\b", "a date"),
    (r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", "a git commit"),
    (r"\b\d+\.\d+\.\d+\w*\b", "a version"),
    (r"\b\d{2}:\d{2}(?::\d{2})?\s+UTC\b", "a time of day"),
    (r"\b(?:Table|section|sections|eq\.|issue|issues|[Rr]un|[Rr]uns) \d+(?:\.\d+)?(?: and \d+)?\b",
     "a reference to the paper, an issue or a run"),
    (r"\b[Pp]rocess(?:es)? \d+\b", "a process index"),
    (r"\bkill -9\b", "a signal's number"),
    (r"\bexit(?:s|ed)? \d+\b", "an exit status"),
]
# Settings and labels: what a run or benchmark was asked to do, or which row, step or
# sentence a figure belongs to; nothing measured (each run's JSON `command` and
# `overrides`, or the bench's own flags, record the settings). Matched in the text and
# in its whitespace-flattened form, so a phrase may break across lines. A number
# NON_FIGURES or SETTINGS covers is exempt.
NUM = r"~?\d+(?:\.\d+)?k?"
SERIES = rf"{NUM}(?:(?:-|\.\.| and | or | to |, ){NUM})*"  # '0.6-1.7', '4 and 8', '7000 to 9000'
SETTINGS = [
    (r"(?m)^\d+\. |!\[[^\]]*\]|\b[Ss]entence \d+\b", "a list item's or a figure's number"),
    (rf"\b(?:[Dd]ropout|BPE-dropout|[Ll]abel smoothing|eps_ls =|[Aa]lphas?|[Bb]eams?|[Ww]armup|"
     rf"max_extra|[Vv]ocab|vocabulary|d_model|d_ff|M =|source \+)[- ]{SERIES}",
     "a training, search or shape setting"),
    (rf"\b(?:[Ss]teps?|at|by|from|to|legs of) {SERIES}[- ]steps?\b(?!/)|\b[Ss]teps? {SERIES}\b|"
     rf"\bstep-\d+\b|\b{SERIES}[- ]steps?\b(?!/)|\bstopped at \d+\b",
     "a step count or a position on the schedule"),
    (rf"\b(?:[Ll]ast|[Aa]veraging|the default) {SERIES}\b|\b\d+(?: or \d+)? checkpoints\b",
     "how many checkpoints were averaged (a setting)"),
    (r"\b\d+\+\d+ layers\b|\b\d+k (?:sentencepiece )?vocabulary\b|"
     r"\ba \d+k (?:vocabulary|one)\b|\b\d+k runs\b|\b\d+k-token\b|\b\d+k-way\b|\b\d+ classes\b",
     "the model's or a batch's size (a setting)"),
    (r"\b[Tt]est[- ]2016\b|\b\d+[- ]sentences?\b(?! ?/)|\b\d+k-pair\b|\b\d+ translations\b|"
     r"\b\d+ (?:validation |test )sentences\b|\bpast \d+ words\b|\bat pair [\d,]+|\bUTF-8\b",
     "a data set's name or size"),
    (r"\b\d+ cores, \d+ GB\)|\b\d+(?:-core| (?:CPU |host )?cores?)\b|\b\d+ float32 FLOP per cycle\b|\bAVX-512\b|\b\d+\.\d+ GHz\b|\b\d+ GB, no accelerator\b",
     "the machine's description"),
    (r"\b\d+-(?:bit|D)\b", "a data width or a rank"),
    (r"\[\d+ x \d+\]|\b\d+(?: x \d+)+(?= tokens| slots|[;,)]| draw| =| \|)|"
     r"\b\d+ (?:packed )?rows x \d+ (?:tokens|slots)\b|\b\d+ rows\b|"
     r"\b\d+-token\b|\b\d+ tokens per side\b|"
     r"\bn = \d+\b", "a tensor or batch shape"),
    (rf"\b[Bb]atch(?:es)? (?:of )?{SERIES}\b|\baim's \d+\b", "a batch size (a setting)"),
    (r"\b[Mm]edians? of \d+\b", "how often a benchmark repeats (a setting)"),
    (r"\b[Aa]im (?:of )?\d+(?:\.\d+)?[x%]?|[<>]= \d+(?:\.\d+)?(?: ?[x%]| s| min| GB)?|> 0\b|"
     r"\baim\*\* \(at least \d+x|\blosing at most \d+(?:\.\d+)? BLEU\b|"
     r"\*\*First batch within \d+ s\*\*|\b\d+(?:\.\d+)? bound\b",
     "an aim: the issue's target, not a measurement"),
    (r"\breached 30 and 35\b|\b95% (?:bootstrap )?intervals?\b",
     "a threshold or a confidence level (a setting)"),
    (r"\bPython \d+\.\d+\b|\bCUDA \d+\b|\bH100 80GB\b|\bSHA-256\b", "a name or a version"),
    (rf"\b[Ee]very {SERIES}\b|\b{SERIES} chunks\b|\b\d+-character\b|\bcapped at \d+ kB\b|"
     rf"\ba repeated \d+ MB allocation\b|\b\d+\^3\b|"
     rf"\bsession's \d+ minutes\b|\b(?:up to|then) \d+(?:\.\d+)? s (?:more|later)\b|\{{0, 1/\(1-rate\)\}}|\w\^\d+\b",
     "a cadence, a size or a budget a bench or test was given (a setting), or a formula"),
    (r"\b\d+ (?:simulated |host )?(?:CPU |input )?(?:devices?|workers?|GPUs|P100s|H100s|threads?)\b|"
     r"\bover \d+ rounds\b",
     "a device or worker count (a setting or the machine)"),
]


def uncovered(docs: dict[str, Doc], rendered: dict[str, list[tuple[int, int]]]
              ) -> list[tuple[str, int, str]]:
  """Numbers in the docs that no check covers, no rendered block holds and no
  NON_FIGURES or SETTINGS pattern exempts: (doc, line, 'number<TAB>its context') each."""
  out = []
  for name, doc in docs.items():
    spans = list(doc.covered) + list(rendered.get(name, []))
    for pattern, _ in NON_FIGURES + SETTINGS:
      spans += [m.span() for m in re.finditer(pattern, doc.text, re.S | re.M)]
    for pattern, _ in SETTINGS:  # Also where a phrase breaks across lines.
      spans += [(doc.offsets[m.start()], doc.offsets[m.end() - 1] + 1)
                for m in re.finditer(pattern, doc.flat) if m.end() > m.start()]
    spans.sort()
    starts = [a for a, _ in spans]
    for number in NUMBER.finditer(doc.text):
      a, b = number.span()
      i = bisect.bisect_right(starts, a)
      if any(s <= a and b <= e for s, e in spans[:i]):
        continue
      context = " ".join(doc.text[max(0, a - 30):b + 30].split())
      out.append((name, doc.text.count("\n", 0, a) + 1, f"{number.group()}\t{context}"))
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", default=str(render_docs.ROOT), help="the repository to check")
  args = parser.parse_args()
  root = Path(args.root)
  texts = {name: (root / name).read_text() for name in render_docs.doc_names(root)}
  # Markers and templates blanked (offsets kept): the numbers in them are no figures, and
  # a phrase a figure sits in reads as the reader sees it ('(aim 950').
  docs = {name: Doc(re.sub(r"<!--.*?-->", lambda m: " " * len(m[0]), text, flags=re.S))
          for name, text in texts.items()}
  mismatches, missing = check(root, docs)
  rendered = {name: render_docs.spans(text) for name, text in texts.items()}
  untraced = [f"{name}:{line}: {entry.split(chr(9))[0]} is not rendered or a setting "
              f"(...{entry.split(chr(9))[1]}...): render it from its file (a table or a "
              "<!--{template}--> figure, tools/render_docs.py), or remove it"
              for name, line, entry in uncovered(docs, rendered)]
  for line in missing + mismatches + untraced:
    print(line)
  print(f"{sum(len(r) for r in rendered.values())} rendered tables and figures: "
        f"{len(mismatches)} misquoted, {len(missing)} missing, {len(untraced)} untraced")
  return 2 if missing else 1 if mismatches or untraced else 0


if __name__ == "__main__":
  sys.exit(main())
