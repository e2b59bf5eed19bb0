"""A workdir in a bucket: the files training and translation write and read, and the
checkpoints orbax writes through TensorStore, against servers the tests start on
localhost (conftest's gcs_bucket and s3_bucket), as real buckets would be; and the
errors for what cannot work."""

import json
import subprocess
import sys

import numpy as np
import pytest

import jax

import conftest
from conftest import RUN_STEPS, ROOT, cpu_env, kill_resume_and_compare
from flax_transformer import storage
from flax_transformer.errors import ConfigError


def test_local_and_bucket_locations():
  """What --workdir becomes: a local directory stays a pathlib.Path; a bucket keeps
  its scheme through joins and str() (pathlib would make gs:/bucket, a local folder)
  and goes through fsspec, the client its extra installs; anything else is refused."""
  from pathlib import Path

  from etils.epath import backend

  for local in ("runs/a", Path("runs/a"), "/tmp/runs/a/"):
    path = storage.as_path(local) / "checkpoints"
    assert isinstance(path, Path) and not storage.is_remote(path)
    assert str(path) == str(local).rstrip("/") + "/checkpoints"
  for bucket in ("gs://bucket/run", "s3://bucket/run/"):
    path = storage.as_path(bucket) / "checkpoints" / "100"
    assert storage.is_remote(path) and str(path) == bucket.rstrip("/") + "/checkpoints/100"
    assert path._backend is backend.fsspec_backend  # noqa: SLF001
    assert str(storage.as_path(path)) == str(path)  # Made again from a path: the same.
  with pytest.raises(ConfigError, match=r"unsupported storage scheme hdfs://"):
    storage.as_path("hdfs://cluster/run")


def test_a_missing_client_names_its_extra(monkeypatch):
  real = storage.importlib.util.find_spec
  monkeypatch.setattr(storage.importlib.util, "find_spec",
                      lambda name: None if name == "s3fs" else real(name))
  with pytest.raises(ConfigError, match=r"s3:// paths need s3fs.*flax-transformer\[s3\]"):
    storage.as_path("s3://bucket/run")


@pytest.mark.parametrize("bucket", ["gcs_bucket", "s3_bucket"])
def test_workdir_files_in_a_bucket(bucket, request, multi30k_tokenizer):
  from flax_transformer import workdir as workdir_lib
  from flax_transformer.data.tokenizer import Tokenizer
  from flax_transformer.network.config import TransformerConfig
  from flax_transformer.training import metrics

  bucket = request.getfixturevalue(bucket)
  run = workdir_lib.Workdir(f"{bucket}/run")
  assert str(run.checkpoints) == f"{bucket}/run/checkpoints"  # Not a local "gs:" folder.
  # The vocabulary, written whole and read back from the bucket.
  storage.write_atomically(run.vocab_file, multi30k_tokenizer.path.read_bytes())
  tokenizer = Tokenizer(run.vocab_file)
  text = "A man rides a bike."
  np.testing.assert_array_equal(tokenizer.tokenize(text), multi30k_tokenizer.tokenize(text))
  # The run record, and a second launch appended to it.
  config = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64,
                             num_heads=4, num_layers=1)
  workdir_lib.record_run(run, config, tokenizer.vocab_size, launch={"n": 1})
  workdir_lib.record_run(run, config, tokenizer.vocab_size, launch={"n": 2})
  assert [x["n"] for x in json.loads(run.run_file.read_text())["launches"]] == [1, 2]
  model_config, read_tokenizer = workdir_lib.read_run(run)
  assert model_config == config and read_tokenizer.vocab_size == tokenizer.vocab_size
  workdir_lib.check_present(run, step=1)
  # metrics.jsonl: an object cannot be appended to, yet a resumed run continues it.
  for steps in ((1, 2), (3,)):
    writer = metrics.create_writer(run)
    for step in steps:
      writer.write_scalars(step, {"loss": float(step), "wall_s": 10.0 * step})
    writer.flush()
    writer.close()
  assert [r["step"] for r in metrics.read_metrics(run)] == [1, 2, 3]
  assert metrics.previous_wall_time(run) == 30.0
  # TensorBoard: the event files reach the bucket.
  events = [p.name for p in run.tensorboard.iterdir()]
  assert len(events) == 2 and all(name.startswith("events.out.tfevents") for name in events)
  assert all(len((run.tensorboard / name).read_bytes()) > 0 for name in events)


def test_s3_locations_reach_tensorstore_with_the_aws_endpoint(monkeypatch):
  monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
  monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://minio:9000")  # The S3 one wins.
  monkeypatch.setenv("AWS_REGION", "eu-west-1")
  assert storage.s3_kvstore("s3://b/runs/x/") == {
      "driver": "s3", "bucket": "b", "path": "runs/x/", "endpoint": "http://minio:9000",
      "aws_region": "eu-west-1"}


@pytest.mark.parametrize("bucket", ["gcs_bucket", "s3_bucket"])
def test_training_in_a_bucket_killed_resumes_bit_exactly_and_decodes(
    bucket, request, tmp_path, multi30k_dir, uninterrupted, local_translations):
  """train.py with its workdir in the bucket, kill -9 after a checkpoint, the same
  command again: the final parameters are those of the uninterrupted local run,
  decode.py translates from the bucket as from that run's directory, checkpoint
  averaging reads and writes the bucket, and a step without its commit file (a save
  cut short) is not listed."""
  workdir = f"{request.getfixturevalue(bucket)}/trained"
  kill_resume_and_compare(workdir, multi30k_dir, uninterrupted)
  assert not (ROOT / "gs:").exists() and not (ROOT / "s3:").exists()

  from_bucket = decode(workdir, tmp_path)
  assert from_bucket == local_translations and len(from_bucket.splitlines()) == 2

  # average_checkpoints.py's work, bucket to bucket: the mean of the last two.
  from flax_transformer import averaging, checkpoints
  from flax_transformer.workdir import Workdir, read_run

  averaged = f"{workdir}-avg2"
  assert averaging.write_averaged(workdir, averaged, last=2) == [RUN_STEPS - 10, RUN_STEPS]
  model_config, _ = read_run(averaged)
  read_back, _ = averaging.load_params(averaged, model_config)
  expected, _ = averaging.load_params(uninterrupted[0], model_config, average_last=2)
  for a, b in zip(jax.tree_util.tree_leaves(read_back), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  # A save cut short in a bucket (its commit file not yet written) is no checkpoint.
  (Workdir(workdir).checkpoints / str(RUN_STEPS) / "commit_success.txt").unlink()
  assert checkpoints.Checkpointer(workdir, read_only=True).steps()[-1] == RUN_STEPS - 10


def decode(workdir, tmp_path) -> str:
  """decode.py's output for two sentences."""
  source = tmp_path / "in.en"
  source.write_text("A man rides a bike.\nTwo dogs play in the snow.\n")
  result = subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}",
                           f"--input={source}", f"--compilation_cache_dir={conftest.XLA_CACHE}"],
                          env=cpu_env(), capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout


@pytest.fixture(scope="module")
def local_translations(uninterrupted, tmp_path_factory):
  return decode(uninterrupted[0], tmp_path_factory.mktemp("decode"))


# --- Metrics in a bucket: each flush adds objects, none is rewritten -------------------

def bucket_objects(prefix: str) -> dict[str, tuple[int, int]]:
  """{object name: (size in bytes, generation)} under gs://... `prefix`, listed afresh."""
  import fsspec

  fs = fsspec.filesystem("gs")
  fs.invalidate_cache()
  return {path.rsplit("/", 1)[1]: (int(info["size"]), int(info["generation"]))
          for path, info in fs.find(prefix, detail=True).items()}


def event_steps(data: bytes) -> list[int]:
  """The steps of the scalar summaries in one TensorBoard event file (TFRecords:
  length, its CRC, an Event proto, its CRC)."""
  import struct

  from tensorboardX.proto import event_pb2

  steps, at = [], 0
  while at < len(data):
    (length,) = struct.unpack("<Q", data[at:at + 8])
    event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
    at += 12 + length + 4
    if any(v.HasField("simple_value") for v in event.summary.value):
      steps.append(event.step)
  return steps


def test_metrics_flushes_to_a_bucket_add_objects_of_their_own_size(gcs_bucket):
  """Each flush writes only what was logged since the last, as new objects: the bytes
  uploaded per flush stay those of one flush however long the run, and no object
  written before is replaced (its generation unchanged)."""
  from flax_transformer.training import metrics
  from flax_transformer.workdir import Workdir

  run = Workdir(f"{gcs_bucket}/flushes")
  writer = metrics.create_writer(run)
  writer.write_hparams({"d_model": 32})
  seen, added = {}, []
  for flush in range(6):
    for step in range(10 * flush + 1, 10 * flush + 11):
      writer.write_scalars(step, {"loss": 2.5, "wall_s": 1000.0 + step})
    writer.flush()
    now = bucket_objects(f"{gcs_bucket}/flushes")
    assert {name: now[name] for name in seen} == seen  # Nothing rewritten.
    new = set(now) - set(seen)
    # One metrics object and one event file per flush.
    assert sorted(name.startswith("events.out.tfevents.") for name in new) == [False, True], new
    added.append(sum(now[name][0] for name in new))
    seen = now
  writer.close()
  assert bucket_objects(f"{gcs_bucket}/flushes") == seen  # Closing after a flush adds nothing.
  # The first flush carries the hparams too; every later one costs the same.
  assert len(set(added[1:])) == 1 and added[0] > added[1], added
  assert [r["step"] for r in metrics.read_metrics(run)] == list(range(1, 61))
  events = sorted(run.tensorboard.iterdir(), key=lambda p: p.name)
  assert [s for e in events for s in event_steps(e.read_bytes())] == [
      s for s in range(1, 61) for _ in ("loss", "wall_s")]


def test_two_launches_writing_metrics_to_one_bucket_keep_every_line(gcs_bucket):
  """Two writers on one workdir in a bucket (a relaunch while the first still logs),
  flushing in turn: every line of both is read back, each launch's in order, the
  earlier launch first; both launches' TensorBoard events are kept too."""
  from flax_transformer.training import metrics
  from flax_transformer.workdir import Workdir

  run = Workdir(f"{gcs_bucket}/two_launches")
  first, second = metrics.create_writer(run), metrics.create_writer(run)
  for step in (1, 2, 3):
    first.write_scalars(step, {"loss": 1.0, "wall_s": float(step)})
    first.flush()
    second.write_scalars(100 + step, {"loss": 2.0, "wall_s": float(step)})
    second.flush()
  first.close()
  second.close()
  assert [r["step"] for r in metrics.read_metrics(run)] == [1, 2, 3, 101, 102, 103]
  steps = [s for e in run.tensorboard.iterdir() for s in event_steps(e.read_bytes())]
  assert sorted(set(steps)) == [1, 2, 3, 101, 102, 103] and len(steps) == 12


def test_metrics_of_a_bucket_workdir_from_before_the_per_flush_objects(gcs_bucket):
  """A bucket workdir whose metrics.jsonl an older version wrote whole: its lines come
  first, then the resumed run's objects; wall time continues from its last line."""
  from flax_transformer.training import metrics
  from flax_transformer.workdir import Workdir

  run = Workdir(f"{gcs_bucket}/old_layout")
  storage.write_atomically(run.metrics_file, '{"step": 1, "wall_s": 5.0}\n{"step": 2, "wall_s": 9.0}\n')
  assert metrics.previous_wall_time(run) == 9.0
  writer = metrics.create_writer(run)
  writer.write_scalars(3, {"wall_s": 12.0})
  writer.close()
  assert [r["step"] for r in metrics.read_metrics(run)] == [1, 2, 3]
  assert metrics.previous_wall_time(run) == 12.0


def test_a_launch_after_a_crash_mid_line_keeps_its_own_first_record(tmp_path):
  """A crash cut metrics.jsonl's last line: the next launch's writer (as the loop opens
  it on resume) starts on a new line, so only the cut record is lost, not its own first."""
  from flax_transformer.training import metrics
  from flax_transformer.workdir import Workdir

  run = Workdir(tmp_path)
  writer = metrics.JsonlWriter(run)
  for step in (1, 2, 3):
    writer.write_scalars(step, {"loss": 1.0, "wall_s": float(step)})
  writer.close()
  text = run.metrics_file.read_text()
  run.metrics_file.write_text(text[:-9])  # Step 3's line, cut mid-number.
  resumed = metrics.JsonlWriter(run)
  for step in (3, 4):
    resumed.write_scalars(step, {"loss": 0.5, "wall_s": 10.0 + step})
  resumed.close()
  assert [r["step"] for r in metrics.read_metrics(run)] == [1, 2, 3, 4]
  assert metrics.previous_wall_time(run) == 14.0
