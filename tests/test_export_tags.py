"""export.py of an imported OPUS-MT model whose target is a tag before the source
('>>fra<< A dog runs.': tests/fixtures/marian_swish_shared, >>deu<< and >>fra<<): the
StableHLO and CTranslate2 folders' translate.py --target_lang puts the tag as decode.py
--target_lang does, and translates as transformers did with the tagged sources
(references.json, written by tests/fixtures/make_pretrained.py)."""

import json
from pathlib import Path

import pytest

from flax_transformer.pretrained import importer
from flax_transformer.workdir import languages as workdir_languages
from test_export import BLOCKED_RUN, run

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "marian_swish_shared"
FORMATS = ["stablehlo", "ctranslate2"]


@pytest.fixture(scope="module")
def tagged_sentences():
  """transformers' greedy outputs of the fixture's tagged sources, by target code: (the
  sources without their tag, transformers' texts)."""
  ref = json.loads((FIXTURE / "references.json").read_text(encoding="utf-8"))
  by_code: dict[str, tuple[list[str], list[str]]] = {}
  for source, text in zip(ref["sources"], ref["greedy_text"]):
    if source.startswith(">>"):
      code, bare = source[2:source.index("<<")], source[source.index("<<") + 3:]
      by_code.setdefault(code, ([], []))
      by_code[code][0].append(bare)
      by_code[code][1].append(text)
  assert sorted(by_code) == ["deu", "fra"]
  return by_code


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
  """The fixture imported, then exported greedy (references.json's search: max_extra 20)
  in each format."""
  folder = tmp_path_factory.mktemp("tags")
  importer.import_model(FIXTURE, folder / "run")
  out = {}
  for fmt in FORMATS:
    done = run(ROOT / "export.py", f"--workdir={folder / 'run'}", f"--out={folder / fmt}",
               f"--format={fmt}", "--beam_size=1", "--max_extra=20", "--batch_tokens=256")
    assert done.returncode == 0, done.stderr[-3000:]
    out[fmt] = folder / fmt
  return folder / "run", out


@pytest.mark.parametrize("fmt", FORMATS)
def test_translate_py_target_lang_puts_the_tag_as_transformers_read_it(
    fmt, exports, tagged_sentences, tmp_path):
  """Before: the manifest had no languages and translate.py no --target_lang (argparse:
  'unrecognized arguments'), so an export could only be told its target by a user who
  knew to write '>>fra<<' into every line."""
  workdir, folders = exports
  folder = folders[fmt]
  manifest = json.loads((folder / "manifest.json").read_text())
  assert manifest["languages"] == workdir_languages(workdir).to_json()
  for (code, (bare, theirs)), end in zip(tagged_sentences.items(), ["\n", "\r\n"]):
    source, output = tmp_path / f"{code}.en", tmp_path / f"{code}.out"
    source.write_bytes("".join(s + end for s in [bare[0], "", *bare[1:]]).encode())
    done = run("-c", BLOCKED_RUN, folder / "translate.py", f"--input={source}",
               f"--output={output}", f"--target_lang={code}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stderr
    # An empty line stays empty; each line ends as its input line did (a Windows file's
    # "\r\n", as decode.py's: it wrote "\n").
    assert output.read_bytes() == "".join(t + end for t in [theirs[0], "", *theirs[1:]]
                                          ).encode(), code


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_target_the_model_has_no_tag_for_is_one_line_naming_those_it_has(
    fmt, exports, tmp_path):
  _, folders = exports
  source = tmp_path / "in.en"
  source.write_text("A dog runs.\n")
  done = run(folders[fmt] / "translate.py", f"--input={source}", "--target_lang=ita",
             f"--output={tmp_path / 'out'}")
  assert done.returncode == 2 and not (tmp_path / "out").exists()
  assert done.stderr.strip().splitlines() == [
      "error: --target_lang=ita: the model translates into deu, fra"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_output_that_cannot_be_written_is_one_line_before_translating(fmt, exports, tmp_path):
  """--output a folder, or a file in a folder that does not exist: a traceback (exit 1)
  once every line was translated, the work lost; now one line and exit 2, at once."""
  _, folders = exports
  source = tmp_path / "in.en"
  source.write_text("A dog runs.\n")
  for output in (tmp_path, tmp_path / "missing" / "out.de"):
    done = run(folders[fmt] / "translate.py", f"--input={source}", f"--output={output}",
               "--target_lang=deu")
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"error: --output {output}: not a file in an existing folder"]


def test_an_output_that_fails_when_written_is_one_line(exports, tmp_path):
  """An --output whose folder exists but whose write fails (a full disk: Linux's
  /dev/full; a read-only file system, no permission) passes the check made first: the
  write's error is one line and exit 2, not a traceback (exit 1)."""
  _, folders = exports
  source = tmp_path / "in.en"
  source.write_text("A dog runs.\n")
  done = run(folders["ctranslate2"] / "translate.py", f"--input={source}",
             "--output=/dev/full", "--target_lang=deu")
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.strip().splitlines() == [
      "error: --output /dev/full: No space left on device"]
