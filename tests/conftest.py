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
  path = tmp_path_factory.mktemp("vocab") / tokenizer.VOCAB_FILENAME
  return tokenizer.train_tokenizer(data.vocabulary_sentences(pairs, 100_000), path,
                                   vocab_size=4000)


def pytest_configure(config):
  # Every sharding feature is tested on 8 simulated CPU devices; set before jax starts.
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
