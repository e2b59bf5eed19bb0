"""TensorFlow installed beside the package changes nothing for buckets: etils would
send gs:// and s3:// through tf.io.gfile, bypassing the fsspec clients storage.py
checks for and the tests exercise, and storage keeps them on fsspec.

TensorFlow is not installed here. etils decides it is by
`importlib.util.find_spec("tensorflow")` (etils/epath/gpath.py, `_is_tf_installed`),
so a `tensorflow` package on the path that cannot be imported is, to etils, an
installed TensorFlow. Each case runs in its own process: etils decides once.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT


@pytest.fixture
def env_with_tensorflow(tmp_path):
  package = tmp_path / "tensorflow"
  package.mkdir()
  (package / "__init__.py").write_text('raise ImportError("a stand-in for find_spec")\n')
  env = {k: v for k, v in os.environ.items() if k != "EPATH_USE_TF"}  # Set by storage here.
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
  return env


def run(script: str, env: dict) -> str:
  result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout


def test_buckets_stay_on_fsspec_with_tensorflow_installed(env_with_tensorflow):
  out = run("""
      import os
      from etils import epath
      from etils.epath import backend
      from flax_transformer import storage
      for text in ("gs://bucket/run", "s3://bucket/run"):
        path = storage.as_path(text) / "checkpoints"
        # orbax makes its own paths from strings: those too.
        again = epath.Path(os.fspath(path))
        print(text, path._backend is backend.fsspec_backend,
              again._backend is backend.fsspec_backend)
      """, env_with_tensorflow)
  assert out.split("\n")[:2] == ["gs://bucket/run True True", "s3://bucket/run True True"]


def test_etils_having_chosen_tensorflow_is_a_clear_error(env_with_tensorflow):
  """A bucket path made before storage is imported fixes etils on tf.io.gfile (which
  shows the stand-in is taken for TensorFlow); as_path then says so."""
  out = run("""
      from etils import epath
      from etils.epath import backend
      print("etils chose tf:", epath.Path("gs://bucket/x")._backend is backend.tf_backend)
      from flax_transformer import storage
      from flax_transformer.errors import ConfigError
      try:
        storage.as_path("s3://bucket/run")
      except ConfigError as e:
        print("ConfigError:", e)
      """, env_with_tensorflow)
  assert "etils chose tf: True" in out
  assert ("ConfigError: s3://bucket/run: etils sends s3:// through TensorFlow's tf.io.gfile"
          in out) and "set EPATH_USE_TF=false" in out
