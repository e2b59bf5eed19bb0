"""The mutation check (bench/mutants.py) stays runnable and its committed run current:
each paper-critical mutant still patches the code it names, results/bench/mutants.json
(with the runs of mutants added since) records a run of exactly these mutants, every
one caught, and one mutant run live here, through the bench's own machinery, is caught."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import mutants  # noqa: E402


def test_every_mutant_still_applies_to_exactly_one_place():
  assert [p for p in map(mutants.check_applies, mutants.MUTANTS) if p] == []
  assert len({m.name for m in mutants.MUTANTS}) == len(mutants.MUTANTS)


# Mutants added since the last run of them all, each file a run of them alone
# (bench/mutants.py --only NAME ... --json FILE); a full run takes them in again.
ADDED_SINCE: tuple[str, ...] = ()  # The full run at 7103696 took in mutants_issue68.json's.


def test_the_committed_run_is_of_these_mutants_and_caught_them_all():
  records = [json.loads((ROOT / "results" / "bench" / name).read_text())
             for name in ("mutants.json", *ADDED_SINCE)]
  ran = [(m["name"], m["file"], m["old"], m["new"], tuple(m["tests"]))
         for record in records for m in record["mutants"]]
  assert ran == [tuple(m) for m in mutants.MUTANTS], "re-run python bench/mutants.py"
  assert all(record["unmutated"]["passed"] is True for record in records)
  assert [m["name"] for record in records for m in record["mutants"]
          if m["outcome"] != "caught"] == []


# The cheapest mutant to run live: its one named test takes seconds (results/bench/mutants.json).
LIVE = "averaging divides by one more checkpoint"


def test_a_mutant_run_live_is_caught(tmp_path):
  """On a copy of the checkout: its test passes as the code is, fails mutated, and the
  copy is restored after."""
  mutant = next(m for m in mutants.MUTANTS if m.name == LIVE)
  mutants.copy_checkout(tmp_path)
  copied = (tmp_path / mutant.file).read_text()
  outcome, _, tail = mutants.run_tests(tmp_path, mutant.tests, timeout=120)
  assert outcome == "passed", tail
  outcome, _, tail = mutants.run_mutant(tmp_path, mutant, timeout=120)
  assert outcome == "caught", tail
  assert (tmp_path / mutant.file).read_text() == copied


def test_only_a_failing_test_catches_a_mutant(tmp_path):
  """A mutant whose test times out, or that breaks the test's import (a collection
  error, pytest's exit status 2), is not caught: each is its own outcome."""
  (tmp_path / "tests").mkdir()
  (tmp_path / "answer.py").write_text("PAUSE_S = 0\nVALUE = 42\n")
  (tmp_path / "tests" / "test_answer.py").write_text(
      "import time\n\nimport answer\n\n\ndef test_answer():\n"
      "  time.sleep(answer.PAUSE_S)\n  assert answer.VALUE == 42\n")
  tests = ("tests/test_answer.py",)
  mutant = lambda old, new: mutants.Mutant(new, "answer.py", old, new, tests)  # noqa: E731
  outcomes = {new: mutants.run_mutant(tmp_path, mutant(old, new), timeout)[0]
              for old, new, timeout in [("VALUE = 42", "VALUE = 41", 120),
                                        ("VALUE = 42", "VALUE = (", 120),
                                        ("PAUSE_S = 0", "PAUSE_S = 600", 3),
                                        ("VALUE = 42", "VALUE = 6 * 7", 120)]}
  assert outcomes == {"VALUE = 41": "caught", "VALUE = (": "error", "PAUSE_S = 600": "timeout",
                      "VALUE = 6 * 7": "missed"}
  assert (tmp_path / "answer.py").read_text() == "PAUSE_S = 0\nVALUE = 42\n"
