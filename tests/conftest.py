"""Shared fixtures: the real Multi30k files and a vocabulary trained on them once."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Beside the checkout, or where MULTI30K_DIR says (bench/mutants.py runs a copy elsewhere).
MULTI30K = Path(os.environ.get("MULTI30K_DIR") or ROOT.parent / "shared" / "data" / "multi30k")


@pytest.fixture(scope="session")
def multi30k_dir() -> str:
  if not (MULTI30K / "train.en.gz").is_file():
    message = (f"Multi30k not found at {MULTI30K}: put the data beside the checkout "
               "(../shared/data/multi30k) to run the tests that read it")
    if os.environ.get("CI"):  # CI has the data beside it: a missing copy is a failure.
      pytest.fail(message)
    pytest.skip(message)
  return str(MULTI30K)


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_dir, tmp_path_factory):
  from flax_transformer.data import pipeline as data
  from flax_transformer.data import sources
  from flax_transformer.data import tokenizer

  pairs = sources.multi30k("train", "en", "de", manual_dir=multi30k_dir)
  path = tmp_path_factory.mktemp("vocab") / "vocab.model"
  return tokenizer.train_tokenizer(data.vocabulary_sentences(pairs, 100_000), path,
                                   vocab_size=4000)


def pytest_configure(config):
  # Every sharding feature is tested on 8 simulated CPU devices; set before jax starts.
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  config.addinivalue_line("markers", "devices(n): needs n devices (the CPU's 8 simulated ones)")
  if os.environ["JAX_PLATFORMS"] != "cpu":
    # On a GPU (JAX_PLATFORMS=cuda), float32 matmuls default to TF32 (10-bit
    # mantissas), about 1e-3 relative error: the tests' float32 tolerances hold
    # only at full float32 precision, so the suite runs with it. bfloat16 tests
    # have their own tolerances.
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")


def pytest_collection_modifyitems(config, items):
  import jax

  count = jax.device_count()
  for item in items:
    marker = item.get_closest_marker("devices")
    if marker and count < marker.args[0]:
      item.add_marker(pytest.mark.skip(
          reason=f"needs {marker.args[0]} devices, {count} {jax.devices()[0].platform} "
          "device(s) here: runs on the CPU's 8 simulated devices (the default)"))
