"""The mutation check (tools/mutants.py) stays runnable and its committed run current:
each paper-critical mutant resolves to one node of the function it names (or says in one
line why not), results/bench/mutants.json holds a run of each mutant as it stands, its
function unchanged since, every one caught; an anchor survives a reformat and names a
function's new module when it moves; and one mutant run live here is caught."""

import json
import textwrap
from pathlib import Path

from tools import mutants

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutant_still_applies_to_exactly_one_place():
  problems = [p for p in map(mutants.check_applies, mutants.MUTANTS) if p]
  assert not problems, "\n".join(problems)
  assert len({m.name for m in mutants.MUTANTS}) == len(mutants.MUTANTS)


def test_the_committed_run_is_of_these_mutants_and_caught_them_all():
  record = json.loads((ROOT / mutants.RECORD).read_text())
  stale = mutants.stale(record)
  assert not stale, (f"no current run of {stale} (new, changed, or their function changed): "
                     "python -m tools.mutants --changed")
  assert [e["name"] for e in record["mutants"]] == [m.name for m in mutants.MUTANTS]
  assert all(run["unmutated"]["passed"] is True for run in record["runs"])
  assert [e["name"] for e in record["mutants"] if e["outcome"] != "caught"] == []


CODE = '''\
import numpy as np


class Scale:
  def __call__(self, x, d_model):
    """Scales x."""
    return x * np.sqrt(d_model)
'''
# The same code reformatted: another docstring, a comment, other line breaks and spacing.
REFORMATTED = '''\
import numpy as np


class Scale:

  def __call__(self, x, d_model):
    """Multiplies x by sqrt(d_model) (section 3.4)."""
    return (x *  # The paper's scale.
            np.sqrt(
                d_model))
'''


def test_an_anchor_survives_a_reformat_and_names_where_its_function_moved(tmp_path):
  mutant = mutants.Mutant("unscaled", "pkg.layers:Scale.__call__", "np.sqrt(d_model)", "1.0",
                          ("tests/test_x.py",))
  (tmp_path / "flax_transformer").mkdir()
  layers = tmp_path / "flax_transformer" / "layers.py"
  (tmp_path / "pkg").symlink_to(tmp_path / "flax_transformer")
  layers.write_text(CODE)
  before = mutants.anchor(mutant, tmp_path)
  assert "return x * (1.0)" in mutants.mutated(mutant, before)
  layers.write_text(REFORMATTED)  # Reformatted: the same anchor and the same digest.
  after = mutants.anchor(mutant, tmp_path)
  assert after.digest == before.digest
  assert "(x *  # The paper's scale.\n            (1.0))" in mutants.mutated(mutant, after)
  layers.write_text(CODE.replace("np.sqrt(d_model)", "np.sqrt(d_model) + 0"))  # Changed code.
  assert mutants.anchor(mutant, tmp_path).digest != before.digest
  layers.write_text("")  # Moved to another module: one line naming where it is now.
  (tmp_path / "flax_transformer" / "embedding.py").write_text(CODE)
  assert mutants.check_applies(mutant, tmp_path) == (
      "unscaled: pkg.layers has no Scale.__call__; Scale.__call__ is now in "
      "flax_transformer.embedding: update its target in tools/mutant_list.py")
  layers.write_text(CODE.replace("np.sqrt(d_model)", "np.sqrt(d_model) * np.sqrt(d_model)"))
  assert mutants.check_applies(mutant, tmp_path) == (
      "unscaled: its pattern 'np.sqrt(d_model)' occurs 2 times in pkg.layers:Scale.__call__ "
      "(pkg/layers.py), not once")


def test_only_changed_mutants_are_stale():
  """Against a record of every mutant as it stands, one whose function's digest or whose
  pattern differs, and one the record lacks, are the stale ones: just those."""
  current = [{**m._asdict(), "tests": list(m.tests), "digest": mutants.anchor(m).digest}
             for m in mutants.MUTANTS]
  assert mutants.stale({"mutants": current}) == []
  current[0] = {**current[0], "digest": "0" * 16}
  current[1] = {**current[1], "new": current[1]["new"] + " "}
  del current[2]
  assert mutants.stale({"mutants": current}) == [m.name for m in mutants.MUTANTS[:3]]


# The cheapest mutant to run live: its one named test takes seconds (results/bench/mutants.json).
LIVE = "averaging divides by one more checkpoint"


def test_a_mutant_run_live_is_caught(tmp_path):
  """On a copy of the checkout: its test passes as the code is, fails mutated, and the
  copy is restored after."""
  mutant = next(m for m in mutants.MUTANTS if m.name == LIVE)
  mutants.copy_checkout(tmp_path)
  file = mutants.anchor(mutant, tmp_path).file
  copied = (tmp_path / file).read_text()
  outcome, _, tail = mutants.run_tests(tmp_path, mutant.tests, timeout=120)
  assert outcome == "passed", tail
  outcome, _, tail = mutants.run_mutant(tmp_path, mutant, timeout=120)
  assert outcome == "caught", tail
  assert (tmp_path / file).read_text() == copied


def test_only_a_failing_test_catches_a_mutant(tmp_path):
  """A mutant whose test times out, or that breaks the test's import (a collection
  error, pytest's exit status 2), is not caught: each is its own outcome."""
  (tmp_path / "tests").mkdir()
  answer = "PAUSE_S = 0\nVALUE = 42\n"
  (tmp_path / "answer.py").write_text(answer)
  (tmp_path / "tests" / "test_answer.py").write_text(textwrap.dedent("""\
      import time

      import answer


      def test_answer():
        time.sleep(answer.PAUSE_S)
        assert answer.VALUE == 42
      """))
  tests = ("tests/test_answer.py",)
  mutant = lambda old, new: mutants.Mutant(new, "answer", old, new, tests)  # noqa: E731
  outcomes = {new: mutants.run_mutant(tmp_path, mutant(old, new), timeout)[0]
              for old, new, timeout in [("VALUE = 42", "VALUE = 41", 120),
                                        ("VALUE = 42", "VALUE = answer", 120),
                                        ("PAUSE_S = 0", "PAUSE_S = 600", 3),
                                        ("VALUE = 42", "VALUE = 6 * 7", 120)]}
  assert outcomes == {"VALUE = 41": "caught", "VALUE = answer": "error",
                      "PAUSE_S = 600": "timeout", "VALUE = 6 * 7": "missed"}
  assert (tmp_path / "answer.py").read_text() == answer
