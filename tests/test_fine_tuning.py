"""Fine-tuning: train.py --config.init_from=W (training/init_from.py) on Multi30k, from the
session's trained tiny run (conftest.trained_tiny) and from the tiny Marian model of
tests/fixtures imported by import_model.py: what the run keeps of its source, its start
(also sharded), a relaunch, decode.py and serve.py on the result, and the refusals."""

import ast
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest

import conftest
from conftest import ROOT, TRAINED_TINY_CHECKPOINTS, cpu_env, final_params, train_command
from flax_transformer.data import token_cache
from flax_transformer.data.pipeline import TokenizePair
from flax_transformer.data.sources import load_pairs
from flax_transformer.errors import ConfigError, ShardingConfigError
from flax_transformer.pretrained import importer
from flax_transformer.training import init_from
from flax_transformer.training.config_checks import check_config
from flax_transformer.training.sharding import make_mesh
from flax_transformer.training.steps import Trainer
from flax_transformer.workdir import Workdir, read_run

sys.path.insert(0, str(ROOT))
from configs import multi30k  # noqa: E402

SOURCE_STEP = TRAINED_TINY_CHECKPOINTS[-1]
SENTENCES = ["A dog runs in the park.", "Two men are playing football.", "A woman reads."]


def fine_tune_command(workdir, source, multi30k_dir, *overrides) -> list[str]:
  """train.py from `source` with the README job's config file (configs/multi30k.py, whose
  model is not the tiny source's: d_model 256, 3 layers, an 8k vocabulary) at the tiny
  run's batch and lengths: the model and vocabulary must be the source's all the same."""
  command = train_command(workdir, multi30k_dir, f"--config.init_from={source}",
                          "--config.batch_tokens=512", "--config.max_source_length=32",
                          "--config.max_target_length=32", "--config.num_eval_steps=2",
                          "--config.learning_rate=0.3", "--config.warmup_steps=10",
                          "--config.log_every_steps=10", *overrides)
  command[3] = str(ROOT / "configs/multi30k.py")
  return command


@pytest.fixture(scope="module")
def fine_tuned(trained_tiny, multi30k_dir, tmp_path_factory):
  """(workdir, first launch's log, relaunch's log, (step, parameters) of the first launch's
  checkpoint): 10 steps at learning rate 0 (its checkpoint holds the parameters it started
  from, unchanged), then a relaunch with the same init_from, to step 40 at the tiny run's
  rate (as a preempted job's)."""
  workdir = tmp_path_factory.mktemp("fine_tune") / "run"
  logs, first_checkpoint = [], None
  for overrides in (["--config.num_train_steps=10", "--config.learning_rate=0.0"],
                    ["--config.num_train_steps=40"]):
    done = subprocess.run(fine_tune_command(workdir, trained_tiny, multi30k_dir,
                                            "--config.model.dropout_rate=0.2", *overrides),
                          env=cpu_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    logs.append(done.stderr)
    first_checkpoint = first_checkpoint or final_params(workdir)
  return workdir, *logs, first_checkpoint


def test_the_run_starts_from_the_source_checkpoint_with_its_vocabulary_and_model(
    fine_tuned, trained_tiny):
  workdir, first, _, (step, params) = fine_tuned
  record = json.loads(Workdir(workdir).run_file.read_text())
  source = json.loads(Workdir(trained_tiny).run_file.read_text())
  assert record["init_from"] == {"workdir": str(trained_tiny), "step": SOURCE_STEP}
  # The source's model (tiny: d_model 32, 1 layer, 1000 pieces), not the config file's;
  # dropout is the run's own.
  assert record["model"] == {**source["model"], "dropout_rate": 0.2}
  assert record["vocab_size"] == source["vocab_size"]
  assert Workdir(workdir).vocab_file.read_bytes() == Workdir(trained_tiny).vocab_file.read_bytes()
  assert "Training a" not in first and f"checkpoint step {SOURCE_STEP}" in first
  # TensorBoard's hparams text (JSON, in the event file's bytes) names the run's model.
  events = b"".join(f.read_bytes() for f in Workdir(workdir).tensorboard.rglob("*") if f.is_file())
  assert b'"d_model": 32,' in events and b'"d_model": 256,' not in events
  # Independent of the code under test: the first checkpoint, 10 steps at learning rate
  # 0, as orbax reads it from disk, holds the source's parameters bit for bit.
  source_step, source_params = final_params(trained_tiny)
  assert (step, source_step) == (10, SOURCE_STEP)
  leaves, source_leaves = jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(
      source_params)
  assert len(leaves) == len(source_leaves)
  for a, b in zip(leaves, source_leaves):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_relaunch_resumes_and_the_loss_falls(fine_tuned):
  workdir, _, relaunch, _ = fine_tuned
  assert "Resumed from the checkpoint of step 10" in relaunch
  assert "Fine-tuning from" not in relaunch  # Not initialised again from the source.
  metrics = {m["step"]: m for m in map(json.loads, Workdir(workdir).metrics_file.read_text()
                                        .splitlines())}
  # Steps 1-10 at learning rate 0 measure the source; the warmup starts at step 0 again.
  assert metrics[10]["learning_rate"] == 0 and metrics[20]["learning_rate"] > 0
  # The same evaluation batches, before and after 30 steps (measured: 5.00 -> 4.89).
  assert metrics[40]["eval_loss"] < metrics[10]["eval_loss"] - 0.05, metrics
  assert metrics[40]["loss"] < metrics[10]["loss"], metrics
  record = json.loads(Workdir(workdir).run_file.read_text())
  assert len(record["launches"]) == 2 and record["init_from"]["step"] == SOURCE_STEP


@pytest.fixture(scope="module")
def fine_tuned_marian(multi30k_dir, tmp_path_factory):
  """(imported workdir, fine-tuned workdir): the tiny Marian model of tests/fixtures
  (random weights, swish, a shared vocabulary) imported by import_model.py, then
  fine-tuned for 30 steps on Multi30k with an evaluation every 10."""
  folder = tmp_path_factory.mktemp("marian")
  imported, workdir = folder / "imported", folder / "fine_tuned"
  done = subprocess.run([sys.executable, str(ROOT / "import_model.py"),
                         f"--from={ROOT / 'tests/fixtures/marian_swish_shared'}",
                         f"--workdir={imported}"], env=cpu_env(), capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  done = subprocess.run(fine_tune_command(workdir, imported, multi30k_dir,
                                          "--config.num_train_steps=30",
                                          "--config.eval_every_steps=10"),
                        env=cpu_env(), capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  return imported, workdir


def test_fine_tuning_an_imported_marian_model_keeps_its_model_and_tokenizer(fine_tuned_marian):
  imported, workdir = fine_tuned_marian
  record = json.loads(Workdir(workdir).run_file.read_text())
  source = json.loads(Workdir(imported).run_file.read_text())
  assert record["init_from"] == {"workdir": str(imported), "step": 0}
  per_run = init_from.PER_RUN_MODEL_FIELDS
  assert {k: v for k, v in record["model"].items() if k not in per_run} == {
      k: v for k, v in source["model"].items() if k not in per_run}
  assert record["model"]["activation"] == "swish"  # Marian's, not the paper's relu.
  # The fixture's padding row is zeros, as OPUS-MT's: the decoder starts from a zero vector,
  # and 30 steps leave the row at zero (a trained row would drift through the logits).
  assert record["model"]["start_from_zero_embedding"]
  _, params = final_params(workdir)
  embedding = np.asarray(params["shared_embedding"]["embedding"])
  real = record["model"]["vocab_size"] - record["model"]["vocab_padding"]
  assert not np.any(embedding[0]) and np.all(np.any(embedding[1:real] != 0, axis=1))
  assert real == 511 and not np.any(embedding[real:])  # The import's padding: never trained.
  assert (record["tokenizer"], record["vocab_size"]) == (source["tokenizer"],
                                                         source["vocab_size"])
  names = source["tokenizer"]["files"]
  assert len(names) >= 3
  for name in names:
    theirs = Workdir(imported).tokenizer_dir / name
    assert (Workdir(workdir).tokenizer_dir / name).read_bytes() == theirs.read_bytes()
  assert not Workdir(workdir).vocab_file.exists()  # No vocabulary trained.
  metrics = {m["step"]: m for m in map(json.loads, Workdir(workdir).metrics_file.read_text()
                                        .splitlines())}
  # Measured: training loss 4.18 -> 3.88, evaluation loss 3.35 -> 3.27.
  assert metrics[30]["loss"] < metrics[10]["loss"] - 0.1, metrics
  assert metrics[30]["eval_loss"] < metrics[10]["eval_loss"], metrics


def test_training_tokenizes_sources_and_targets_each_with_its_side(fine_tuned_marian,
                                                                   tmp_path):
  """An imported tokenizer has two sides (Marian: source.spm and target.spm): a training
  pair's target is tokenized with the target side, in memory and in the token cache."""
  _, tokenizer = read_run(fine_tuned_marian[1])
  pairs = [("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
           ("A man rides a red bike.", "Ein Mann fährt ein rotes Fahrrad.")]
  source, target = tokenizer.source.tokenize(pairs[1][0]), tokenizer.target.tokenize(pairs[1][1])
  assert not np.array_equal(tokenizer.source.tokenize(pairs[1][1]), target)  # Sides differ.
  for ids in (TokenizePair(tokenizer)(pairs[1]),
              token_cache.load_or_build(pairs, tokenizer, cache_dir=tmp_path)[1]):
    np.testing.assert_array_equal(ids["inputs"], source)
    np.testing.assert_array_equal(ids["targets"], target)


def test_source_prefix_puts_the_target_language_tag_before_every_training_source(tmp_path):
  """config.source_prefix (a multilingual model's '>>deu<< '): every source, of training
  and evaluation, in memory and in the token cache (a key of its own), starts with the
  tag's one token; the targets are as they were."""
  imported = tmp_path / "imported"
  importer.import_model(ROOT / "tests/fixtures/marian_swish_shared", imported)
  _, tokenizer = read_run(imported)
  tag = json.loads((Workdir(imported).tokenizer_dir / "vocab.json").read_text())[">>deu<<"]
  (tmp_path / "a.en").write_text("A dog runs in the park.\nTwo men talk.\n")
  (tmp_path / "a.de").write_text("Ein Hund rennt im Park.\nZwei Männer reden.\n")
  config = config_from(None, dataset_name="text", source_prefix=">>deu<< ")
  for side in ("train", "eval"):
    config[f"{side}_source_file"], config[f"{side}_target_file"] = (
        str(tmp_path / "a.en"), str(tmp_path / "a.de"))
  plain = config_from(None, **{k: config[k] for k in (
      "dataset_name", "train_source_file", "train_target_file")})
  untagged = load_pairs(plain, plain.train_split)
  caches = set()
  for pairs in (load_pairs(config, config.train_split), load_pairs(config, config.eval_split)):
    cached = token_cache.load_or_build(pairs, tokenizer, cache_dir=tmp_path / "cache")
    caches.add(cached.folder)
    for i, (source, target) in enumerate(untagged):
      for ids in (TokenizePair(tokenizer)(pairs[i]), cached[i]):
        assert ids["inputs"][0] == tag and tag not in tokenizer.source.tokenize(source)
        np.testing.assert_array_equal(ids["inputs"][1:], tokenizer.source.tokenize(source))
        np.testing.assert_array_equal(ids["targets"], tokenizer.target.tokenize(target))
  assert token_cache.load_or_build(untagged, tokenizer, tmp_path / "cache").folder not in caches


@pytest.mark.devices(8)
def test_the_start_is_the_source_parameters_sharded_over_a_mesh(fine_tuned_marian, tmp_path,
                                                                 monkeypatch):
  """The imported model's parameters placed on a 2 x 4 mesh (data, fsdp: the `embed`
  dimension split 4 ways), as the trainer's shardings say, unchanged; the optimizer state
  new. Its vocabulary of 511, padded at import, splits over a tensor axis of 2; a workdir
  imported before the padding (511 rows) is refused there, named, and runs with
  docs/training.md's rules."""
  imported = fine_tuned_marian[0]
  config = config_from(imported)
  fine_tuning = init_from.resolve(config, Workdir(tmp_path / "new"))
  config.mesh.update({"data": 2, "fsdp": 2, "tensor": 2})
  trainer = Trainer(fine_tuning.model_config, config, make_mesh(config.mesh))
  assert trainer.state_shardings.params["shared_embedding"]["embedding"].spec[0] == "tensor"
  from flax_transformer.pretrained import vocab_padding
  monkeypatch.setattr(vocab_padding, "MULTIPLE", 1)  # An import before the padding.
  importer.import_model(ROOT / "tests/fixtures/marian_swish_shared", tmp_path / "old")
  monkeypatch.undo()
  record = json.loads(Workdir(tmp_path / "old").run_file.read_text())
  for field in ("vocab_padding", "source_vocab_padding"):  # Not in an older run.json.
    assert record["model"].pop(field) == 0
  Workdir(tmp_path / "old").run_file.write_text(json.dumps(record))
  old = init_from.resolve(config_from(tmp_path / "old"), Workdir(tmp_path / "new_old"))
  assert old.model_config.vocab_size == 511
  with pytest.raises(ShardingConfigError, match=r"\['decoder'\]\['final_logits_bias'\] \[511\]"
                     r": its dimension of 511 does not split over mesh axes tensor .*; a "
                     r"workdir imported before import_model.py padded vocabularies \(to a "
                     r"multiple of 128 rows\) splits once imported again: python "
                     r"import_model.py --from=SOURCE --workdir=NEW_WORKDIR$"):
    Trainer(old.model_config, config, make_mesh(config.mesh))
  # docs/training.md's rules: the default ones with `vocab` on no mesh axis.
  flags = re.findall(r'--config\.logical_axis_rules="(.*?)"',
                     (ROOT / "docs/training.md").read_text())
  assert len(set(flags)) == 1, flags
  rules = ast.literal_eval(flags[0])
  assert [r for r in rules if r[0] != "vocab"] == [
      tuple(r) for r in config.logical_axis_rules if r[0] != "vocab"]
  assert ("vocab", None) in rules and len(rules) == len(config.logical_axis_rules)
  with config.unlocked():
    config.logical_axis_rules = rules
  Trainer(old.model_config, config, make_mesh(config.mesh))
  config.mesh.update({"data": 2, "fsdp": 4, "tensor": 1})
  trainer = Trainer(fine_tuning.model_config, config, make_mesh(config.mesh))
  state = init_from.initial_state(trainer, fine_tuning)
  assert int(state.step) == 0
  leaves = jax.tree_util.tree_leaves(state.params)
  shardings = jax.tree_util.tree_leaves(trainer.state_shardings.params)
  expected = jax.tree_util.tree_leaves(final_params(imported)[1])
  assert len(leaves) == len(shardings) == len(expected)
  for leaf, sharding, theirs in zip(leaves, shardings, expected):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(theirs))
  assert any(not leaf.sharding.is_fully_replicated for leaf in leaves)
  moments = jax.tree_util.tree_leaves(state.opt_state)
  assert moments and all(not np.asarray(m).any() for m in moments)  # Adam's, and its count.


def test_an_imported_workdir_is_refused_before_anything_is_written(fine_tuned_marian,
                                                                   multi30k_dir, tmp_path):
  """Its 4 heads over a tensor axis of 8: one line, and no run.json or tokenizer/ in the
  new workdir; train.py on the imported workdir itself: one line that says to use
  --config.init_from, before a vocabulary is trained into it."""
  imported, workdir = fine_tuned_marian[0], tmp_path / "run"
  done = subprocess.run(fine_tune_command(workdir, imported, multi30k_dir,
                                          "--config.mesh.data=1", "--config.mesh.tensor=8"),
                        env=cpu_env(8), capture_output=True, text=True)
  assert done.returncode == 2, done.stderr[-3000:]
  assert "its dimension of 4 does not split over mesh axes tensor (8 devices)" in (
      done.stderr.strip().splitlines()[-1])
  assert not Workdir(workdir).run_file.exists() and not Workdir(workdir).tokenizer_dir.exists()
  before = sorted(p.name for p in Path(imported).iterdir())
  with pytest.raises(ConfigError, match=re.escape(
      f"{imported} holds a model import_model.py imported; fine-tune it into a new --workdir "
      f"with --config.init_from={imported}")):
    init_from.resolve(config_from(None), Workdir(imported))
  assert sorted(p.name for p in Path(imported).iterdir()) == before


def test_decode_and_serve_translate_with_the_result(fine_tuned_marian, tmp_path):
  """On the fine-tuned Marian model (its tokenizer/ and run.json entry copied from the
  import); a run fine-tuned from a trained workdir is a workdir like any other."""
  workdir = fine_tuned_marian[1]
  common = ["--average_last=1", "--max_extra=5", "--beam_size=2",
            f"--compilation_cache_dir={conftest.XLA_CACHE}"]
  decoded = subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}",
                            *common], input="\n".join(SENTENCES) + "\n", env=cpu_env(),
                           capture_output=True, text=True)
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  lines = decoded.stdout.splitlines()
  assert len(lines) == len(SENTENCES) and all(lines), decoded.stdout
  log = tmp_path / "serve.log"
  with open(log, "wb") as out:
    server = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), f"--workdir={workdir}",
                               "--port=0", "--max_tokens=16", "--max_batch=4", *common],
                              stdout=out, stderr=subprocess.STDOUT, env=cpu_env())
  try:
    deadline = time.time() + 240
    while not (serving := re.search(r"Serving \S+ on (http://127\.0\.0\.1:\d+)/",
                                    log.read_text())):
      assert server.poll() is None and time.time() < deadline, log.read_text()[-3000:]
      time.sleep(0.3)
    request = urllib.request.Request(serving[1] + "/translate",
                                     data=json.dumps({"text": SENTENCES}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
      answer = json.loads(response.read())
  finally:
    server.terminate()
    server.wait(timeout=60)
  assert answer["translations"] == lines


def test_a_model_override_that_contradicts_the_source_is_one_line_exit_2(
    trained_tiny, multi30k_dir, tmp_path):
  workdir = tmp_path / "run"
  done = subprocess.run(fine_tune_command(workdir, trained_tiny, multi30k_dir,
                                          "--config.model.d_model=64",
                                          "--config.model.dropout_rate=0.3"),
                        env=cpu_env(), capture_output=True, text=True)
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.strip().splitlines()[-1] == (
      f"error: config.init_from={trained_tiny} fixes the model config: "
      "--config.model.d_model=64 (the source's: 32) contradicts it. Per-run fields only "
      "(attention_dropout_rate, attention_implementation, decode, deterministic, "
      "dropout_rate, dtype, share_beam_cache) may differ")
  assert not workdir.exists()  # Refused before anything was written.


# --- Refusals and relaunches, in-process (train.py's first step, `init_from.resolve`) ----

def config_from(source, **changes):
  config = multi30k.get_config()
  config.init_from = str(source) if source else ""
  for key, value in changes.items():
    target = config.model if key.startswith("model.") else config
    setattr(target, key.removeprefix("model."), value)
  return config


def copy_run(source, folder: Path, checkpoints: bool) -> Path:
  """`source`'s run.json and vocabulary (and checkpoints) in a new workdir."""
  folder.mkdir()
  for name in ("run.json", "vocab.model") + (("checkpoints",) if checkpoints else ()):
    copy = shutil.copytree if (Path(source) / name).is_dir() else shutil.copyfile
    copy(Path(source) / name, folder / name)
  return folder


def test_refusals_name_the_problem(trained_tiny, fine_tuned, tmp_path):
  def refused(config, workdir, overrides=None) -> str:
    with pytest.raises(ConfigError) as error:
      init_from.resolve(config, Workdir(workdir), overrides)
    return str(error.value)

  new = tmp_path / "new"
  assert "does not exist" in refused(config_from(tmp_path / "missing"), new)
  (tmp_path / "empty").mkdir()
  assert "is not a training workdir" in refused(config_from(tmp_path / "empty"), new)
  bare = copy_run(trained_tiny, tmp_path / "bare", checkpoints=False)
  assert "has no checkpoint" in refused(config_from(bare), new)
  # A workdir with checkpoints of its own: trained from scratch, or from another source.
  message = refused(config_from(fine_tuned[0]), trained_tiny)
  assert "already has checkpoints (steps 30..60): resume it instead, without " \
         "--config.init_from" in message
  assert f"started from {trained_tiny}" in refused(config_from(bare), fine_tuned[0])
  assert "keeps its source's vocabulary" in refused(
      config_from(trained_tiny, vocab_path=str(Workdir(trained_tiny).vocab_file)), new)
  assert "--config.vocab_size=2000 (the source's: 1000)" in refused(
      config_from(trained_tiny, vocab_size=2000), new, {"vocab_size": 2000})
  # The source's max_len (64), not the config file's (128), bounds the lengths.
  config = config_from(trained_tiny, max_source_length=128)
  with pytest.raises(ConfigError, match="max_len of config.init_from's model \\(64\\)"):
    check_config(config, init_from.resolve(config, Workdir(new)).model_config)


def test_what_a_launch_takes_from_the_source_and_from_its_record(trained_tiny, fine_tuned,
                                                                 tmp_path):
  new = Workdir(tmp_path / "new")
  # An override equal to the source's value is no contradiction.
  overrides = {"model.dropout_rate": 0.3, "model.d_model": 32}
  start = init_from.resolve(config_from(trained_tiny, **overrides), new, overrides)
  assert (start.step, start.resuming, start.model_config.dropout_rate) == (SOURCE_STEP, False, 0.3)
  assert start.model_config.d_model == 32 and start.source == Workdir(trained_tiny)
  assert init_from.resolve(config_from(None), new) is None  # A run of its own.
  # The fine-tuned run, relaunched without init_from: it resumes (its own record).
  again = init_from.resolve(config_from(None), Workdir(fine_tuned[0]))
  assert again.resuming and again.step == SOURCE_STEP and again.source == Workdir(trained_tiny)
  # A run stopped before its first checkpoint starts again from the checkpoint its
  # record names, not the source's newest.
  stopped = copy_run(fine_tuned[0], tmp_path / "stopped", checkpoints=False)
  record = json.loads((stopped / "run.json").read_text())
  record["init_from"]["step"] = TRAINED_TINY_CHECKPOINTS[0]
  (stopped / "run.json").write_text(json.dumps(record))
  restart = init_from.resolve(config_from(trained_tiny), Workdir(stopped))
  assert not restart.resuming and restart.step == TRAINED_TINY_CHECKPOINTS[0]
  record["init_from"]["step"] = 45
  (stopped / "run.json").write_text(json.dumps(record))
  with pytest.raises(ConfigError, match="no longer has the checkpoint of step 45"):
    init_from.resolve(config_from(None), Workdir(stopped))
