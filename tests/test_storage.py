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

from conftest import RUN_STEPS, ROOT, cpu_env, kill_resume_and_compare
from flax_transformer import storage
from flax_transformer.errors import ConfigError


def test_local_and_bucket_locations():
  assert not storage.is_remote(storage.as_path("runs/a"))
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
  storage.write_whole(run.vocab_file, multi30k_tokenizer.path.read_bytes())
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
  from flax_transformer import checkpoints
  from flax_transformer.workdir import Workdir, read_run

  averaged = f"{workdir}-avg2"
  assert checkpoints.write_averaged(workdir, averaged, last=2) == [RUN_STEPS - 10, RUN_STEPS]
  model_config, _ = read_run(averaged)
  read_back, _ = checkpoints.load_params(averaged, model_config)
  expected, _ = checkpoints.load_params(uninterrupted[0], model_config, average_last=2)
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
                           f"--input={source}"], env=cpu_env(), capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout


@pytest.fixture(scope="module")
def local_translations(uninterrupted, tmp_path_factory):
  return decode(uninterrupted[0], tmp_path_factory.mktemp("decode"))
