"""Training: the recipe, sharding equivalence, metrics, resuming, signals, bad configs."""

import json
import re
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from flax_transformer.errors import ConfigError
from flax_transformer.loop import train_and_evaluate
from flax_transformer.training import sharding
from flax_transformer.training import steps as training
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.workdir import METRICS_FILE
import conftest
from conftest import cpu_env, free_port, kill_resume_and_compare, train_command

ROOT = Path(__file__).resolve().parents[1]


def tiny_config(multi30k_dir, **changes):
  config = tiny.get_config()
  config.manual_dir = multi30k_dir
  config.compilation_cache_dir = conftest.XLA_CACHE  # Not the developer's ~/.cache.
  config.unlock()
  for key, value in changes.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  config.lock()
  return config


def read_metrics(workdir):
  with open(Path(workdir) / METRICS_FILE) as f:
    return [json.loads(line) for line in f]


def test_schedule_is_the_papers_formula():
  schedule = training.learning_rate_schedule(d_model=512, warmup_steps=4000)
  for step in (1, 100, 3999, 4000, 4001, 100_000):
    expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
    assert abs(float(schedule(step - 1)) - expected) < 1e-9


def test_label_smoothed_loss_against_explicit_distribution():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
  targets = np.array([[3, 5, 0], [1, 0, 0]])
  eps = 0.1
  sums = training.cross_entropy_sums(jnp.asarray(logits), jnp.asarray(targets), eps)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expected = 0.0
  for b, t in zip(*np.nonzero(targets)):
    q = np.full(7, eps / 7)
    q[targets[b, t]] += 1 - eps
    expected += -(q * log_p[b, t]).sum()
  assert float(sums["tokens"]) == 3
  np.testing.assert_allclose(float(sums["loss"]), expected, rtol=1e-5)


def test_label_smoothed_loss_gradients_match_optax():
  """The hand-written backward pass against autodiff of optax's smoothed cross-entropy."""
  import optax
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(2, 5, 11)).astype(np.float32))
  targets = jnp.asarray(rng.integers(0, 11, size=(2, 5)))
  eps, weights = 0.1, (targets != 0).astype(jnp.float32)
  def ours(z):
    sums = training.cross_entropy_sums(z, targets, eps)
    return sums["loss"] + 0.3 * sums["nll"]

  def reference(z):
    onehot = jax.nn.one_hot(targets, 11)
    smooth = optax.softmax_cross_entropy(z, optax.smooth_labels(onehot, eps))
    return jnp.sum(weights * (smooth + 0.3 * optax.softmax_cross_entropy(z, onehot)))
  np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-5)
  np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(reference)(logits), atol=1e-6)


@pytest.fixture(scope="module")
def trained_tiny(multi30k_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("tiny")
  config = tiny_config(multi30k_dir, test_bleu_every_steps=100, profile_steps=2,
                       profile_first_step=3)
  train_and_evaluate(config, str(workdir))
  return config, workdir


def test_tiny_trains_on_multi30k_and_logs(trained_tiny):
  config, workdir = trained_tiny
  records = read_metrics(workdir)
  steps = [r["step"] for r in records]
  assert steps == list(range(10, 101, 10))
  print("tiny loss:", [round(r["loss"], 3) for r in records])
  assert records[-1]["loss"] < records[0]["loss"] - 1.0
  for r in records:
    assert {"loss", "learning_rate", "tokens_per_s", "wall_s"} <= set(r)
  evals = [r for r in records if "eval_loss" in r]
  assert [r["step"] for r in evals] == [50, 100]
  assert {"eval_perplexity", "eval_accuracy", "bleu", "chrf"} <= set(evals[-1])
  # Test-split BLEU only where asked (time-to-quality reports), here the last step: the
  # first num_bleu_sentences of the test split, decoded by the step-100 parameters as
  # Translator decodes them, and scored by sacreBLEU.
  assert [r["step"] for r in records if "test_bleu" in r] == [100]
  import sacrebleu

  from flax_transformer.data import sources
  from flax_transformer.translation.search_config import SearchConfig
  from flax_transformer.translation.translator import Translator

  n = config.num_bleu_sentences
  test = sources.multi30k(config.test_split, "en", "de", manual_dir=config.manual_dir)
  translator = Translator.from_workdir(
      workdir, search=SearchConfig(beam_size=config.beam_size, alpha=config.alpha,
                                   max_extra=config.max_extra), checkpoint_step=100)
  hypotheses = translator.translate(list(test.sources[:n]))
  references = [list(test.targets[:n])]
  assert records[-1]["test_bleu"] == pytest.approx(
      sacrebleu.corpus_bleu(hypotheses, references).score, abs=1e-6)
  assert records[-1]["test_chrf"] == pytest.approx(
      sacrebleu.corpus_chrf(hypotheses, references).score, abs=1e-6)
  assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
  assert Checkpointer(workdir, read_only=True).steps() == [50, 100]
  assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))
  # config.profile_steps: a jax.profiler trace where TensorBoard's profile plugin looks.
  assert list((workdir / "profile" / "plugins" / "profile").glob("*/*.xplane.pb"))


def test_resume_continues_metrics_and_steps(trained_tiny, multi30k_dir):
  _, workdir = trained_tiny
  config = tiny_config(multi30k_dir, num_train_steps=120, bleu_every_steps=0)
  train_and_evaluate(config, str(workdir), launch={"overrides": {"num_train_steps": 120}})
  steps = [r["step"] for r in read_metrics(workdir)]
  assert steps == list(range(10, 101, 10)) + [110, 120]
  # Each start is recorded: what was asked, the whole config, the code and software.
  launches = json.loads((workdir / "run.json").read_text())["launches"]
  assert len(launches) == 2 and launches[1]["overrides"] == {"num_train_steps": 120}
  assert launches[0]["config"]["num_train_steps"] == 100
  assert launches[1]["config"]["num_train_steps"] == 120
  assert {"jax", "flax", "optax"} <= set(launches[1]["packages"])
  assert launches[1]["machine"]["devices"] == jax.device_count()
  # The code: this checkout's commit and whether it was changed (a copy outside git
  # records none, rather than a wrong one).
  git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,  # noqa: E731
                                  text=True).stdout.strip()
  if (ROOT / ".git").exists():
    assert launches[1]["git_commit"] == git("rev-parse", "HEAD")
    assert launches[1]["git_dirty"] == bool(git("status", "--porcelain", "--untracked-files=no"))
  else:
    assert "git_commit" not in launches[1]


def test_a_dirty_checkout_records_its_diff(tmp_path):
  from flax_transformer import provenance

  git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True,  # noqa: E731
                                  capture_output=True, text=True).stdout.strip()
  git("init", "-q")
  (tmp_path / "model.py").write_text("scale = 1.0\n")
  git("add", "model.py")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
  clean = provenance.git_commit(tmp_path)
  assert clean == {"git_commit": git("rev-parse", "HEAD"), "git_dirty": False}
  (tmp_path / "model.py").write_text("scale = 2.0\n")
  (tmp_path / "untracked.txt").write_text("not code that ran")
  dirty = provenance.git_commit(tmp_path)
  assert dirty["git_dirty"] and dirty["git_dirty_files"] == ["model.py"]
  assert "-scale = 1.0\n+scale = 2.0" in dirty["git_diff"]
  # The diff rebuilds the code that ran from the commit.
  git("stash", "-q")
  subprocess.run(["git", "-C", str(tmp_path), "apply"], input=dirty["git_diff"], text=True,
                 check=True)
  assert (tmp_path / "model.py").read_text() == "scale = 2.0\n"


def test_workdir_refuses_a_different_model(trained_tiny, multi30k_dir):
  _, workdir = trained_tiny
  with pytest.raises(ConfigError, match="model.d_model: workdir has 32, config has 64"):
    train_and_evaluate(tiny_config(multi30k_dir, **{"model.d_model": 64}), str(workdir))


# --- Sharding: the same losses on every mesh -------------------------------------

MESHES = [{"data": 8, "fsdp": 1, "tensor": 1}, {"data": 4, "fsdp": 1, "tensor": 2},
          {"data": 1, "fsdp": 8, "tensor": 1}]


def synthetic_batches(n, rows=16, length=12, vocab=64, seed=0):
  rng = np.random.default_rng(seed)
  for _ in range(n):
    lengths = rng.integers(3, length + 1, size=(rows, 2))
    batch = {k: np.zeros((rows, length), np.int32) for k in ("inputs", "targets")}
    for r, (ls, lt) in enumerate(lengths):
      batch["inputs"][r, :ls] = rng.integers(2, vocab, ls)
      batch["targets"][r, :lt] = rng.integers(2, vocab, lt)
    yield batch


def losses_on_mesh(mesh_config, devices, steps=20):
  config = tiny.get_config()
  config.unlock()
  config.mesh = mesh_config
  config.learning_rate = 1.0
  config.warmup_steps = 5
  model_config = training.TransformerConfig(vocab_size=64, d_model=32, d_ff=64, num_heads=4,
                                            num_layers=2, max_len=16)
  mesh = sharding.make_mesh(mesh_config, devices)
  trainer = training.Trainer(model_config, config, mesh)
  state = trainer.init_state(seed=0)
  losses = []
  for batch in synthetic_batches(steps):
    placed = jax.device_put(batch, trainer.batch_sharding)
    state, metrics = trainer.train_step(state, placed)
    losses.append(float(metrics["loss"]))
  return np.array(losses), state, trainer


@pytest.fixture(scope="module")
def single_device_losses():
  return losses_on_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])[0]


@pytest.mark.parametrize("mesh_config", MESHES, ids=lambda m: "x".join(
    f"{k}{v}" for k, v in m.items() if v > 1))
def test_meshes_match_single_device(mesh_config, single_device_losses):
  losses, state, trainer = losses_on_mesh(mesh_config, jax.devices())
  assert single_device_losses[-1] < single_device_losses[0]
  np.testing.assert_allclose(losses, single_device_losses, atol=1e-4, rtol=0)
  # Parameters are laid out as the rules say.
  query = state.params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
  embedding = state.params["shared_embedding"]["embedding"]
  if mesh_config["tensor"] == 2:
    assert query.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    assert query.addressable_shards[0].data.shape == (32, 2, 8)
    assert embedding.addressable_shards[0].data.shape == (32, 32)  # vocab split in two.
  if mesh_config["fsdp"] == 8:
    assert query.addressable_shards[0].data.shape == (4, 4, 8)  # embed split in eight.
    mu = state.opt_state[0][0].mu["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
    assert mu.addressable_shards[0].data.shape == (4, 4, 8)
  if mesh_config["data"] == 8:
    assert query.sharding.is_fully_replicated


def test_grad_accumulation_matches_full_batch():
  config = tiny.get_config()
  config.unlock()
  config.learning_rate = 1.0
  config.warmup_steps = 5
  model_config = training.TransformerConfig(vocab_size=64, d_model=32, d_ff=64, num_heads=4,
                                            num_layers=2, max_len=16, dropout_rate=0.0)
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  runs = []
  for accum in (1, 4):
    config.grad_accum_steps = accum
    trainer = training.Trainer(model_config, config, mesh)
    state = trainer.init_state(seed=0)
    metrics = []
    for batch in synthetic_batches(5):
      state, m = trainer.train_step(state, jax.device_put(batch, trainer.batch_sharding))
      metrics.append((float(m["loss"]), float(m["grad_norm"]), float(m["tokens"])))
    runs.append(np.array(metrics))
  # Same loss, gradient norm and token count: accumulation normalises by the whole batch.
  np.testing.assert_allclose(runs[1], runs[0], rtol=1e-4)


@pytest.mark.parametrize("backward", ["fused", "autodiff"])
def test_padded_vocabulary_smooths_over_the_real_classes_only(backward):
  """A vocabulary padded for sharding (config.vocab_padding: its rows' logits -inf, as an
  imported NLLB's) trains and evaluates with label smoothing as the unpadded model does on
  the same real logits: a finite loss, the same gradients, none for the padded rows."""
  config = tiny.get_config()
  config.unlock()
  config.label_smoothing, config.cross_entropy_backward = 0.1, backward
  shape = dict(d_model=32, d_ff=64, num_heads=4, num_layers=2, max_len=16, dropout_rate=0.0)
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  padded = training.Trainer(training.TransformerConfig(vocab_size=128, vocab_padding=64,
                                                       **shape), config, mesh)
  plain = training.Trainer(training.TransformerConfig(vocab_size=64, **shape), config, mesh)
  params = jax.device_get(padded.init_state(seed=0).params)
  real = jax.tree_util.tree_map(lambda a: a[:64] if a.shape[0] == 128 else a, params)
  batch = next(synthetic_batches(1))
  runs = {}
  for name, trainer, start in (("padded", padded, params), ("plain", plain, real)):
    placed = jax.device_put(batch, trainer.batch_sharding)
    evaluated = jax.device_get(trainer.eval_step(start, placed))
    state, metrics = trainer.train_step(trainer.state_from_params(start), placed)
    runs[name] = evaluated, jax.device_get(metrics), jax.device_get(state.params)
  (eval_p, step_p, after_p), (eval_u, step_u, after_u) = runs["padded"], runs["plain"]
  assert np.isfinite(eval_p["loss"]) and np.isfinite(step_p["loss"])
  assert not step_p["nonfinite"]
  for key in ("loss", "nll", "correct", "tokens"):
    np.testing.assert_allclose(eval_p[key], eval_u[key], rtol=1e-5)
  for key in ("loss", "nll", "grad_norm"):
    np.testing.assert_allclose(step_p[key], step_u[key], rtol=1e-5)
  embedding = after_p["shared_embedding"]["embedding"]
  np.testing.assert_allclose(embedding[:64], after_u["shared_embedding"]["embedding"],
                             atol=1e-6)
  np.testing.assert_array_equal(embedding[64:], params["shared_embedding"]["embedding"][64:])


@pytest.mark.parametrize("with_branch", [True, False], ids=["cpu_branch", "accelerator_select"])
def test_nonfinite_step_changes_no_parameter_or_optimiser_state(with_branch):
  config = tiny.get_config()
  config.unlock()
  config.learning_rate = 1e30  # The first update overflows the parameters...
  model_config = training.TransformerConfig(vocab_size=64, d_model=32, d_ff=64, num_heads=4,
                                            num_layers=2, max_len=16, dropout_rate=0.0)
  trainer = training.Trainer(model_config, config,
                             sharding.make_mesh({"data": 1}, jax.devices()[:1]))
  trainer.skip_with_branch = with_branch
  state = trainer.init_state(seed=0)
  batches = [jax.device_put(b, trainer.batch_sharding) for b in synthetic_batches(2)]
  state, first = trainer.train_step(state, batches[0])
  assert not bool(first["nonfinite"])
  before = jax.device_get((state.params, state.opt_state))
  state, second = trainer.train_step(state, batches[1])  # ...so this loss is not finite.
  assert bool(second["nonfinite"])
  after = jax.device_get((state.params, state.opt_state))
  for old, new in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)):
    np.testing.assert_array_equal(new, old)
  assert int(state.step) == 2


def test_mesh_errors_name_the_key():
  with pytest.raises(sharding.ShardingConfigError, match="needs 6 devices but 8 are present"):
    sharding.make_mesh({"data": 3, "fsdp": 2, "tensor": 1})
  with pytest.raises(sharding.ShardingConfigError, match="fixed axes multiply to 3"):
    sharding.make_mesh({"data": -1, "fsdp": 3, "tensor": 1})
  # A batch that splits over the 8 devices but not into 3 micro-batches on each: a
  # ConfigError as any bad setting (callers of setup_run catch that one type).
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  sharding.check_divisible(48, mesh, micro_batches=3)
  with pytest.raises(ConfigError, match="grad_accum_steps=3 micro-batches over 8"):
    sharding.check_divisible(16, mesh, micro_batches=3)


# --- The command line: kill -9, SIGTERM, bad configs ----------------------------

def test_kill_minus_nine_then_resume_reaches_the_same_parameters(tmp_path, multi30k_dir,
                                                                 uninterrupted):
  kill_resume_and_compare(tmp_path, multi30k_dir, uninterrupted)


# train.py in this process with its steps watched: each dispatched step's loss is kept,
# and a thread waits for them in turn; once step STOP_AFTER has run on the devices it
# looks again which step runs now (the first not yet done) and sends this process
# SIGTERM, then prints that step and how many the host had dispatched.
WATCHED_TRAIN = """
import os, runpy, signal, sys, threading
sys.argv = ["train.py", *sys.argv[1:]]
sys.path.insert(0, os.getcwd())
from flax_transformer.training.steps import Trainer
STOP_AFTER, dispatched, train_step = int(os.environ["STOP_AFTER"]), [], Trainer.train_step
def watched(self, state, batch):
  state, metrics = train_step(self, state, batch)
  dispatched.append(metrics["loss"])
  return state, metrics
def watch():
  while len(dispatched) < STOP_AFTER:
    threading.Event().wait(0.001)
  dispatched[STOP_AFTER - 1].block_until_ready()
  seen = list(dispatched)
  running = next((i for i, loss in enumerate(seen) if not loss.is_ready()), len(seen)) + 1
  os.kill(os.getpid(), signal.SIGTERM)
  print(f"WATCHED running {running} dispatched {len(seen)}", file=sys.stderr, flush=True)
Trainer.train_step = watched
threading.Thread(target=watch, daemon=True).start()
runpy.run_path("train.py", run_name="__main__")
"""


def test_sigterm_stops_within_two_steps_of_the_running_one_saves_and_exits(tmp_path,
                                                                          multi30k_dir):
  """SIGTERM once step 10 has run, no log step near (the metrics' fetch would sync host
  and devices): the loop stops at most two steps after the step the devices were
  running, saves that step and exits 0. At 726c415 the host had dispatched ~30 steps
  ahead, and the stop waited for all of them."""
  command = train_command(tmp_path, multi30k_dir, "--config.num_train_steps=100000",
                          "--config.checkpoint_every_steps=100000",
                          "--config.log_every_steps=100000", "--config.batch_tokens=2048")
  done = subprocess.run([command[0], "-c", WATCHED_TRAIN, *command[2:]], cwd=conftest.ROOT,
                        env=dict(cpu_env(), STOP_AFTER="10"), capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "SIGTERM received" in done.stderr
  running, dispatched = map(int, re.search(r"WATCHED running (\d+) dispatched (\d+)",
                                           done.stderr).groups())
  stopped = int(re.search(r"Stopped by SIGTERM at step (\d+)", done.stderr)[1])
  assert running <= stopped <= running + 2, (running, dispatched, stopped)
  assert Checkpointer(tmp_path, read_only=True).steps() == [stopped]


# train.py in this process with its saves and BLEU searches watched: each save prints its
# step; the first BLEU batch searched sends this process SIGTERM and prints the time.
WATCHED_BLEU = """
import os, runpy, signal, sys, time
sys.argv = ["train.py", *sys.argv[1:]]
sys.path.insert(0, os.getcwd())
from flax_transformer import evaluation
from flax_transformer.checkpoints import Checkpointer
save, translate_ids = Checkpointer.save, evaluation.translate_ids
def watched_save(self, step, *args, **kwargs):
  print(f"WATCHED save {step}", file=sys.stderr, flush=True)
  return save(self, step, *args, **kwargs)
def watched_translate_ids(search_fn, *args, **kwargs):
  def search(*arguments):
    out = search_fn(*arguments)
    if not os.environ.get("SENT"):
      os.environ["SENT"] = "1"
      print(f"WATCHED SIGTERM {time.time()}", file=sys.stderr, flush=True)
      os.kill(os.getpid(), signal.SIGTERM)
    return out
  return translate_ids(search, *args, **kwargs)
Checkpointer.save, evaluation.translate_ids = watched_save, watched_translate_ids
runpy.run_path("train.py", run_name="__main__")
"""


def test_sigterm_during_the_bleu_evaluation_cuts_it_short_saves_and_exits(tmp_path,
                                                                          multi30k_dir):
  """Step 20 is due a checkpoint, the eval loss and a BLEU of 1014 sentences in ~40
  batches; SIGTERM after its first batch. The save has started before the evaluation,
  the BLEU stops at the next batch (logged, not reported), and the process exits: a
  preemption notice (~30 s) is not spent on the evaluation. Before, the whole decode ran
  (the README config's takes ~1 min), then the save."""
  command = train_command(tmp_path, multi30k_dir, "--config.num_train_steps=100000",
                          "--config.checkpoint_every_steps=20", "--config.log_every_steps=20",
                          "--config.eval_every_steps=20", "--config.bleu_every_steps=20",
                          "--config.num_bleu_sentences=-1", "--config.eval_batch_tokens=256",
                          "--config.num_eval_steps=1")
  done = subprocess.run([command[0], "-c", WATCHED_BLEU, *command[2:]], cwd=conftest.ROOT,
                        env=cpu_env(), capture_output=True, text=True, timeout=300)
  exited = time.time()
  assert done.returncode == 0, done.stderr[-3000:]
  err = done.stderr
  assert err.index("WATCHED save 20") < err.index("WATCHED SIGTERM"), err[-3000:]
  assert err.count("WATCHED save") == 1  # Not saved again after the evaluation.
  searched, total = map(int, re.search(r"BLEU cut short by the stop: (\d+) of (\d+) sentences",
                                       err).groups())
  assert 0 < searched < total / 10, (searched, total)
  assert "Stopped by SIGTERM at step 20" in err
  assert exited - float(re.search(r"WATCHED SIGTERM (\S+)", err)[1]) < 20
  assert Checkpointer(tmp_path, read_only=True).steps() == [20]
  [record] = [r for r in read_metrics(tmp_path) if r["step"] == 20]
  assert "eval_loss" in record and "bleu" not in record


BAD_CONFIGS = [
    ("--config.model.d_model=30", "d_model=30 is not divisible by num_heads=4"),
    ("--config.mesh.data=3", "needs 3 devices but 1 are present"),
    ("--config.manual_dir=/nonexistent", "/nonexistent/train.en.gz: no such file"),
    ("--config.max_target_length=500", "exceed config.model.max_len"),
    ("--config.subword_sampling_alpha=1.5", "subword_sampling_alpha must be in [0, 1)"),
]


@pytest.fixture(scope="module")
def bad_config_runs(tmp_path_factory, multi30k_dir) -> dict[str, tuple[int, str]]:
  """train.py with each of BAD_CONFIGS' overrides, all launched at once (each stops in its
  setup: its time is Python's and jax's start, which the cores then share): override ->
  (exit code, stderr)."""
  processes = {override: subprocess.Popen(
      train_command(tmp_path_factory.mktemp("bad_config"), multi30k_dir, override),
      env=cpu_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
      for override, _ in BAD_CONFIGS}
  stderrs = conftest.stderr_of_each(processes, timeout=300)
  return {override: (p.returncode, stderrs[override]) for override, p in processes.items()}


@pytest.mark.parametrize("override, message", BAD_CONFIGS)
def test_bad_config_exits_2_with_a_message(bad_config_runs, override, message):
  returncode, stderr = bad_config_runs[override]
  assert returncode == 2, stderr
  assert message in stderr
  assert "Traceback" not in stderr


@pytest.mark.parametrize("key, value, message", [
    ("prng_impl", "philox", "config.prng_impl must be one of threefry2x32, rbg, unsafe_rbg"),
    ("cross_entropy_backward", "auto", r"cross_entropy_backward must be one of \('fused', 'autodiff'\)"),
    ("profile_steps", -1, "profile_steps and config.profile_first_step must be >= 0"),
    # Refused before the data is read (not after every direction's files are loaded).
    ("pair_temperature", 0.0, r"config.pair_temperature=0.0: must be > 0"),
    ("pair_temperature", -1.0, r"config.pair_temperature=-1.0: must be > 0"),
    ("pair_temperature", float("nan"), r"config.pair_temperature=nan: must be > 0"),
])
def test_bad_recipe_choices_are_config_errors(multi30k_dir, key, value, message):
  from flax_transformer.errors import ConfigError
  from flax_transformer.training.config_checks import check_config

  with pytest.raises(ConfigError, match=message):
    check_config(tiny_config(multi30k_dir, **{key: value}))


def test_two_processes_of_4_devices_match_one_of_8(tmp_path, multi30k_dir):
  """20 steps of jax.distributed over two processes with 4 CPU devices each, against
  one process with 8 devices fed the same global batches: the same mesh (data: 8), the
  same math. Only the gradient all-reduce differs: across processes it is gloo's sum,
  in one process XLA's, and float32 sums in another order differ in the last bits,
  which Adam's updates carry forward step by step (measured: half the 20 losses
  differ, by at most 2e-7 of the loss). Hence 1e-5 of the loss, not bit equality.

  The resume below is a relaunch on the compilation cache the first launch filled: process 0
  loads its steps in seconds while process 1 compiles its own (jax's CPU cache keys differ
  by process, and only process 0 writes), and process 0 must not enter the first
  collective alone (gloo gives a peer 30 s there; before the fix, 6 of 9 such launches
  hung)."""
  from flax_transformer.data import pipeline as data
  from flax_transformer.data import sources
  from flax_transformer.network.config import TransformerConfig
  from flax_transformer.data.tokenizer import Tokenizer

  steps = 20
  cache = f"--config.compilation_cache_dir={tmp_path / 'xla'}"  # Its own: filled here.
  command = train_command(tmp_path, multi30k_dir, f"--config.num_train_steps={steps}",
                          "--config.log_every_steps=1", "--config.eval_every_steps=20",
                          "--config.bleu_every_steps=20", "--config.num_bleu_sentences=8", cache)
  _, stderr = two_processes(command)
  assert "Devices: 8 (cpu), mesh {'data': 8, 'fsdp': 1, 'tensor': 1}, 2 process(es)" in stderr
  records = read_metrics(tmp_path)
  assert [r["step"] for r in records] == list(range(1, steps + 1))
  assert "bleu" in records[-1]
  two_process = np.array([r["loss"] for r in records])

  # One process, 8 devices, fed the same global batches: both hosts' rows, in order.
  config = tiny_config(multi30k_dir)
  model_config = TransformerConfig.from_dict(json.loads((tmp_path / "run.json").read_text())[
      "model"])
  tokenizer = Tokenizer(tmp_path / "vocab.model")
  examples = data.pretokenized(sources.multi30k("train", "en", "de", manual_dir=multi30k_dir),
                               data.TokenizePair(tokenizer))
  batching = data.train_batching(config, data_parallel_size=8, process_count=2)
  hosts = [iter(data.train_dataset(examples, batching, seed=config.seed, process_index=i,
                                   process_count=2)) for i in range(2)]
  trainer = training.Trainer(model_config, config, sharding.make_mesh({"data": 8}))
  state = trainer.init_state(config.seed)
  single = []
  for _ in range(steps):
    parts = [next(h) for h in hosts]
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    state, metrics = trainer.train_step(state, jax.device_put(batch, trainer.batch_sharding))
    single.append(float(metrics["loss"]))
  np.testing.assert_allclose(two_process, single, rtol=1e-5, atol=0)

  # The same two processes resume past a newest checkpoint (step 20) that only process 1
  # cannot load (its data-iterator file is cut short). Both must fall back to step 10:
  # alone, process 1 would train from another step than process 0, or wait for it in a
  # collective. Process 0 sets step 20 aside, and every process must list it no more, or
  # orbax refuses to save step 20 anew when training gets there.
  iterator_file = tmp_path / "checkpoints" / "20" / "data" / "process_1-of-2.json"
  iterator_file.write_text(iterator_file.read_text()[:10])
  resumed = two_processes(train_command(tmp_path, multi30k_dir, "--config.num_train_steps=25",
                                        "--config.checkpoint_every_steps=5",
                                        "--config.log_every_steps=1", cache))
  assert "Train step for batch [16, 32] loaded from the compilation cache" in resumed[0]
  # Process 0 began its first step only once process 1 had compiled its own (a hang
  # needs a slow host; this fails on any host if process 0 does not wait).
  ready = log_time(resumed[0], "processes ready for the first step")
  compiled = log_time(resumed[1], "Train step for batch [16, 32] compiled")
  assert ready and compiled and ready >= compiled, resumed[0][-3000:]
  for stderr in resumed:
    assert "Resumed from the checkpoint of step 10" in stderr
    assert "step 20: process 1: JSONDecodeError" in stderr
  assert "Moved the unusable checkpoint" in resumed[0]
  assert [p.name.split(".")[0] for p in (tmp_path / "checkpoints").glob("*.unusable-*")] == ["20"]
  assert Checkpointer(tmp_path, read_only=True).steps()[-3:] == [15, 20, 25]
  # From step 10, with both processes' data iterators: the uninterrupted run's losses.
  again = read_metrics(tmp_path)[steps:]
  assert [r["step"] for r in again] == list(range(11, 26))
  np.testing.assert_array_equal([r["loss"] for r in again[:10]], two_process[10:])


def log_time(stderr: str, text: str) -> str:
  """'MMDD HH:MM:SS.micros' of the first absl log line holding `text` ('' if none)."""
  return next((line[1:21] for line in stderr.splitlines() if text in line), "")


def two_processes(command: list[str]) -> list[str]:
  """`command` as processes 0 and 1 of one run (4 CPU devices each) on this host; their
  stderr, once both exited 0."""
  command = command + [f"--coordinator_address=localhost:{free_port()}", "--num_processes=2"]
  env = cpu_env(device_count=4)
  processes = [subprocess.Popen(command + [f"--process_id={i}"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(2)]
  # A hang (processes waiting in each other's collectives) fails, leaving none behind.
  outputs = list(conftest.stderr_of_each(dict(enumerate(processes)), timeout=300).values())
  for p, stderr in zip(processes, outputs):
    assert p.returncode == 0, stderr[-3000:]
  return outputs


def test_slurm_job_is_detected_without_flags_and_writes_one_bucket(s3_bucket, multi30k_dir):
  """Two tasks of a SLURM job step (as srun sets them up): one run over two processes,
  its workdir in an S3 bucket (docs/multi_host.md's recipe), both processes' checkpoint shards
  in it."""
  from flax_transformer.training import metrics
  from flax_transformer.workdir import Workdir

  steps = 4
  workdir = f"{s3_bucket}/slurm"
  command = train_command(workdir, multi30k_dir, f"--config.num_train_steps={steps}",
                          "--config.log_every_steps=1")
  slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2",
           "SLURM_STEP_NUM_NODES": "1", "JAX_COORDINATOR_PORT": str(free_port())}
  processes = [subprocess.Popen(command, env={**cpu_env(), **slurm, "SLURM_PROCID": str(i),
                                              "SLURM_LOCALID": str(i)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(2)]
  outputs = list(conftest.stderr_of_each(dict(enumerate(processes)), timeout=300).values())
  for p, stderr in zip(processes, outputs):
    assert p.returncode == 0, stderr
  assert "Cluster detected by jax.distributed: process 0 of 2" in outputs[0]
  assert "Cluster detected by jax.distributed: process 1 of 2" in outputs[1]
  assert "2 process(es)" in outputs[0]
  assert [r["step"] for r in metrics.read_metrics(Workdir(workdir))] == list(range(1, steps + 1))
  assert Checkpointer(workdir, read_only=True).steps() == [steps]
  state = Workdir(workdir).checkpoints / str(steps) / "state"
  assert {p.name for p in state.iterdir() if p.name.startswith("ocdbt.process_")} == {
      "ocdbt.process_0", "ocdbt.process_1"}



def test_analytic_flops_match_xlas_count_of_the_forward_pass():
  """The MFU numerator: 3x the forward matmuls, checked against XLA's CPU count."""
  from flax_transformer.network.config import TransformerConfig
  from flax_transformer.network.model import Transformer

  config = TransformerConfig(vocab_size=1000, d_model=64, d_ff=256, num_heads=4, num_layers=2,
                             num_decoder_layers=3, max_len=48, deterministic=True)
  rows, source_len, target_len = 4, 40, 24
  inputs = jnp.ones((rows, source_len), jnp.int32)
  targets = jnp.ones((rows, target_len), jnp.int32)
  model = Transformer(config)
  # Shapes only: XLA counts the program, not the values (an eager init took 20 s here).
  params = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), inputs[:1], targets[:1])["params"])
  compiled = jax.jit(lambda p: model.apply({"params": p}, inputs, targets)).lower(
      params).compile()
  analysis = compiled.cost_analysis()
  xla_forward = (analysis[0] if isinstance(analysis, (list, tuple)) else analysis)["flops"]
  analytic_forward = training.train_step_flops(config, rows, source_len, target_len) / 3
  # XLA also counts softmax, LayerNorm and other elementwise work: a few percent more.
  assert 1.0 <= xla_forward / analytic_forward < 1.15, (xla_forward, analytic_forward)


def test_bleu_runs_on_its_own_cadence(tmp_path, multi30k_dir):
  """BLEU every 7 steps while log, eval and save run every 10: BLEU at 7 and the end."""
  config = tiny_config(multi30k_dir, num_train_steps=14, log_every_steps=10,
                       eval_every_steps=10, bleu_every_steps=7, checkpoint_every_steps=100,
                       num_bleu_sentences=8, eval_max_shapes=1)  # One shape: fewer compiles.
  train_and_evaluate(config, str(tmp_path))
  records = read_metrics(tmp_path)
  assert [r["step"] for r in records if "bleu" in r] == [7, 14]
  assert [r["step"] for r in records if "eval_loss" in r] == [10, 14]


def test_work_due_after_names_each_cadence():
  from flax_transformer.training.cadence import WorkDue, work_due_after

  config = tiny.get_config()
  config.unlock()
  config.update(num_train_steps=30, log_every_steps=10, eval_every_steps=15,
                bleu_every_steps=0, test_bleu_every_steps=0, checkpoint_every_steps=20)
  assert work_due_after(config, 7) == WorkDue()
  assert work_due_after(config, 10) == WorkDue(log=True)
  assert work_due_after(config, 15) == WorkDue(eval=True)
  assert work_due_after(config, 20) == WorkDue(log=True, save=True)
  assert work_due_after(config, 21, stopping=True) == WorkDue(log=True, save=True)
  # A stop (a preemption notice) drops the evaluations: the save must not wait for them.
  assert work_due_after(config, 15, stopping=True) == WorkDue(log=True, save=True)
  assert work_due_after(config, 30, stopping=True) == WorkDue(log=True, save=True)
  assert work_due_after(config, 30) == WorkDue(log=True, eval=True, save=True)  # 0 = never, even last.
  # By time: at a log step once the minutes have passed, never between log steps.
  config.checkpoint_every_minutes = 10
  assert work_due_after(config, 10, seconds_since_save=599) == WorkDue(log=True)
  assert work_due_after(config, 10, seconds_since_save=600) == WorkDue(log=True, save=True)
  assert work_due_after(config, 7, seconds_since_save=6000) == WorkDue()
