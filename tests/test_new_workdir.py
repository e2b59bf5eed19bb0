"""One import, one workdir (issue 74, item 3): import_model.py's workdir is written whole
by one writer; a workdir whose tokenizer is not its model's is refused when read; a
--workdir that is a file, and a config.json with absurd sizes, are one line and exit 2."""

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

from flax_transformer import storage
from flax_transformer.averaging import load_params
from flax_transformer.errors import ConfigError, DataError
from flax_transformer.pretrained import convert, importer
from flax_transformer.workdir import read_run

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED, SEPARATE = FIXTURES / "marian_swish_shared", FIXTURES / "marian_gelu_separate"


def files_of(workdir) -> dict[str, bytes]:
  """The tokenizer's files of `workdir` (local or in a bucket), name -> bytes."""
  return {p.name: p.read_bytes() for p in sorted((workdir / "tokenizer").iterdir())}


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
  """Each raced model imported alone, once for the module, into a local folder: what
  the race's winner must equal, wherever it raced. (In the bucket each import took ~10 s
  on the GCS emulator; a local import's files, record and parameters are the same.)"""
  root = tmp_path_factory.mktemp("alone")
  for folder in (SHARED, SEPARATE):
    importer.import_model(folder, root / folder.name)
  return {folder: root / folder.name for folder in (SHARED, SEPARATE)}


@pytest.mark.parametrize("where", ["local", "gcs_bucket", "s3_bucket"])
def test_two_imports_racing_for_one_workdir_leave_one_whole_model(tmp_path, monkeypatch,
                                                                  request, where, alone):
  """Two imports of different models (shared and separate vocabularies) into one new
  workdir, local or in a bucket (gs:// on the emulator, s3:// on moto), both checked and converted before
  either writes (a barrier there): one wins, the other ends with one ConfigError line,
  and the workdir is the winner's whole: its tokenizer files, its run record and its
  parameters, as its import alone gives. Before: both wrote into the one folder; the
  loser's record_run refused it after its tokenizer files had overwritten the winner's."""
  root = tmp_path if where == "local" else storage.as_path(
      f"{request.getfixturevalue(where)}/{tmp_path.name}")
  barrier, check_tree = threading.Barrier(2, timeout=60), convert.check_tree

  def held_check(*args, **kwargs):
    barrier.wait()  # Both imports found the workdir new.
    return check_tree(*args, **kwargs)

  monkeypatch.setattr(convert, "check_tree", held_check)
  workdir, outcome = root / "raced", {}

  def run(folder):
    try:
      importer.import_model(folder, workdir)
      outcome[folder] = None
    except Exception as e:  # noqa: BLE001
      outcome[folder] = e

  threads = [threading.Thread(target=run, args=(folder,)) for folder in (SHARED, SEPARATE)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(300)
  [winner] = [folder for folder, error in outcome.items() if error is None]
  [error] = [error for error in outcome.values() if error is not None]
  assert isinstance(error, ConfigError), repr(error)
  if where == "local":
    assert str(error) == (f"--workdir={workdir}: another writer created it while this one "
                          "ran (its files are kept, none of this one's were written there): "
                          "use a new --workdir")
  else:  # The loser's claim failed, or came after the winner's whole workdir.
    assert re.fullmatch(rf"--workdir={re.escape(str(workdir))}(: another import is writing "
                        r"it .*| exists and is not empty: use a new one)", str(error)), error
  storage.drop_cached_listings(root)
  assert [p.name for p in root.iterdir()] == ["raced"]  # No staging folder left.
  assert sorted(p.name for p in workdir.iterdir()) == ["checkpoints", "run.json", "tokenizer"]
  assert files_of(workdir) == files_of(alone[winner])
  record, reference = (json.loads((w / "run.json").read_text()) for w in (workdir, alone[winner]))
  assert record == reference
  model_config, _ = read_run(workdir)
  ours, theirs = (load_params(w, model_config)[0] for w in (workdir, alone[winner]))
  for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_workdir_with_another_models_tokenizer_is_refused_naming_both_sizes(tmp_path):
  """A workdir whose tokenizer files were replaced by a smaller model's (its vocab.json
  without its last two pieces): read_run refuses it, naming the model's size and the
  tokenizer's, and decode.py exits 2 with that line. Before: read and translated."""
  workdir = tmp_path / "imported"
  importer.import_model(SHARED, workdir)
  vocab_file = workdir / "tokenizer" / "vocab.json"
  vocab = json.loads(vocab_file.read_text())
  size = len(vocab)
  vocab_file.write_text(json.dumps({p: i for p, i in vocab.items() if i < size - 2}))
  message = (f"{workdir / 'run.json'}: the model's source vocabulary has {size} entries but "
             f"the tokenizer's ({workdir / 'tokenizer'}) has {size - 2}: its files are "
             "another model's; import or train into a new workdir")
  with pytest.raises(DataError) as raised:
    read_run(workdir)
  assert str(raised.value) == message
  done = subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}"],
                        input="a house\n", capture_output=True, text=True, timeout=300)
  assert done.returncode == 2, done.stderr[-2000:]
  assert [line for line in done.stderr.splitlines() if line.startswith("error")] == [
      f"error: {message}"], done.stderr[-2000:]
  assert "Traceback" not in done.stderr


def absurd(tmp_path: Path, **fields) -> Path:
  folder = tmp_path / "absurd"
  shutil.copytree(SHARED, folder)
  config = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**config, **fields}))
  return folder


@pytest.mark.parametrize("fields, message", [
    ({"d_model": 10**30}, "d_model=1000000000000000000000000000000, but "
     "model.encoder.layers.0.fc1.weight in model.safetensors is 64 x 32"),
    ({"decoder_ffn_dim": 2**62, "encoder_ffn_dim": 2**62}, "encoder_ffn_dim=4611686018427387904, "
     "but model.encoder.layers.0.fc1.weight in model.safetensors is 64 x 32"),
    ({"decoder_layers": 10**12}, "decoder_layers=1000000000000, but model.safetensors has 2 "
     "decoder layers"),
])
def test_absurd_sizes_in_config_json_are_refused_against_the_weights(tmp_path, fields,
                                                                     message):
  """Sizes no model has (d_model=10**30 was a numpy ValueError traceback in the position
  table) are checked against the weights' shapes before anything is built."""
  folder = absurd(tmp_path, **fields)
  with pytest.raises(DataError) as raised:
    importer.import_model(folder, tmp_path / "run")
  assert str(raised.value) == f"{folder / 'config.json'}: {message}"
  assert not (tmp_path / "run").exists()


def test_import_model_py_bad_workdir_and_sizes_are_one_line_exit_2(tmp_path):
  """The command: --workdir naming a file (was a NotADirectoryError traceback), and
  d_model=10**30 (a ValueError traceback): one line on stderr each, exit 2, nothing
  written."""
  a_file = tmp_path / "a_file"
  a_file.write_text("notes")
  folder = absurd(tmp_path, d_model=10**30)
  cases = {(SHARED, a_file): f"error: --workdir={a_file} is a file, not a directory: give a "
           "new directory's path",
           (folder, tmp_path / "run"): f"error: {folder / 'config.json'}: d_model=10000000000"
           "00000000000000000000, but model.encoder.layers.0.fc1.weight in model.safetensors "
           "is 64 x 32"}
  processes = {case: subprocess.Popen(
      [sys.executable, str(ROOT / "import_model.py"), f"--from={case[0]}",
       f"--workdir={case[1]}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
      for case in cases}
  for case, process in processes.items():
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == [cases[case]], stderr
  assert a_file.read_text() == "notes" and not (tmp_path / "run").exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "absurd"]


HELD_IMPORT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # As from a terminal, not `cmd &`.
from flax_transformer.pretrained import convert, importer
fill = convert._fill_workdir
def held(*args):
  fill(*args)
  print("filled", flush=True)
  time.sleep(120)
convert._fill_workdir = held
importer.import_model(sys.argv[1], sys.argv[2])
"""


def test_an_import_killed_while_writing_leaves_no_hidden_copy(tmp_path):
  """An import stopped after its files were written aside, before the rename: by SIGTERM
  (a scheduler's stop) or SIGINT (Ctrl-C), one line, exit 143 or 130 (SIGINT: was a
  KeyboardInterrupt traceback), and no hidden folder; by SIGKILL, the hidden
  folder it left (a whole model's size) is removed by the next import beside it, which
  writes the workdir. Before: SIGTERM and SIGKILL both left `.w.<pid>-<hex>.partial`
  folders that nothing ever removed."""
  workdir = tmp_path / "w"
  for signal_number, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130),
                              (signal.SIGKILL, -signal.SIGKILL)):
    process = subprocess.Popen([sys.executable, "-c", HELD_IMPORT, str(SHARED), str(workdir)],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline() == "filled\n", process.stderr.read()[-2000:]
    process.send_signal(signal_number)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr[-2000:]
    assert not workdir.exists()
    if signal_number != signal.SIGKILL:
      assert "Traceback" not in stderr
      assert [line for line in stderr.splitlines() if line.startswith("error")] == [
          f"error: --workdir={workdir}: stopped by {signal_number.name} while it was being "
          "written; nothing was written there"], stderr[-2000:]
      assert sorted(p.name for p in tmp_path.iterdir()) == []
  [left] = [p.name for p in tmp_path.iterdir()]
  assert left.startswith(".w.") and left.endswith(".partial")
  importer.import_model(SHARED, workdir)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]
  assert read_run(workdir)[0].without_vocab_padding().vocab_size == 511


def test_a_workdir_that_is_a_loop_of_links_is_one_line(tmp_path):
  """--workdir=a link to itself: one ConfigError before converting (was a RuntimeError
  traceback from Path.resolve, after the whole model was converted)."""
  loop = tmp_path / "loop"
  loop.symlink_to(loop)
  with pytest.raises(ConfigError, match=rf"--workdir={re.escape(str(loop))} is a symbolic link "
                                        "that leads nowhere"):
    importer.import_model(SHARED, loop)


@pytest.mark.parametrize("folder, name", [(SHARED, "vocab.json"),
                                          (FIXTURES / "fsmt", "vocab-src.json")])
def test_a_workdir_whose_vocabulary_is_not_json_is_one_line(tmp_path, folder, name):
  """A workdir whose tokenizer/ vocabulary was cut short (a full disk, an edit): decode.py
  exits 2 naming the file. Before: a json.JSONDecodeError traceback."""
  workdir = tmp_path / "imported"
  importer.import_model(folder, workdir)
  (workdir / "tokenizer" / name).write_text('{"<pad>": 0, "</s>"')
  done = subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}"],
                        input="a house\n", capture_output=True, text=True, timeout=300)
  assert done.returncode == 2, done.stderr[-2000:]
  assert "Traceback" not in done.stderr
  [line] = [line for line in done.stderr.splitlines() if line.startswith("error")]
  assert line.startswith(f"error: {workdir / 'tokenizer' / name}: not JSON ("), line


@pytest.mark.parametrize("text, message", [
    ('{"model": ', r"not JSON \(Expecting value: line 1 column 11 \(char 10\)\)"),
    ("[1]", r"not a run record \(a JSON object\), but a list"),
    ("{}", r'not a run record: no "model" object \(the model\'s settings\)'),
    ('{"model": {"vocab_size": "big"}}', r'its "model" record is not a valid model \(invalid '
     r"literal for int\(\) with base 10: 'big'\)"),
])
def test_a_run_json_that_is_not_a_record_is_one_line(tmp_path, text, message):
  """run.json cut short (a full disk) or edited: read_run and the languages record (what
  decode.py reads first) raise one DataError naming it; decode.py exits 2 with that line.
  Before: a JSONDecodeError, TypeError or ValueError traceback, exit 1."""
  from flax_transformer import workdir as workdir_lib

  workdir = tmp_path / "imported"
  importer.import_model(SHARED, workdir)
  (workdir / "run.json").write_text(text)
  expected = rf"^{re.escape(str(workdir / 'run.json'))}: {message}$"
  with pytest.raises(DataError, match=expected):
    read_run(workdir)
  if text != "{}" and not text.startswith('{"model": {'):  # Records the languages read.
    with pytest.raises(DataError, match=expected):
      workdir_lib.languages(workdir)
  if text == "[1]":
    done = subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}"],
                          input="a house\n", capture_output=True, text=True, timeout=300)
    assert (done.returncode, "Traceback" in done.stderr) == (2, False), done.stderr[-2000:]
    assert [line for line in done.stderr.splitlines() if line.startswith("error")] == [
        f"error: {workdir / 'run.json'}: not a run record (a JSON object), but a list"]


def test_a_workdir_under_a_file_is_refused_before_converting(tmp_path, monkeypatch):
  """--workdir=a_file/run: one ConfigError naming the file, before the model is read
  (was 'cannot create a directory beside it (File exists)' after converting it whole:
  minutes for NLLB's 2.4 GB)."""
  a_file = tmp_path / "a_file"
  a_file.write_text("notes")

  def not_reached(*args, **kwargs):
    raise AssertionError("converted before the workdir was checked")

  monkeypatch.setattr(importer, "import_folder", not_reached)
  with pytest.raises(ConfigError) as raised:
    importer.import_model(SHARED, a_file / "run" / "deeper")
  assert str(raised.value) == (f"--workdir={a_file / 'run' / 'deeper'} lies under {a_file}, "
                               "a file, not a directory: give a new directory's path")
  assert a_file.read_text() == "notes"
