"""Local directories and object-storage buckets (gs://, s3://) behind one path type.

A location with a scheme becomes an `etils.epath.Path` (fsspec underneath: gcsfs
for gs://, s3fs for s3://, each an extra of this package); any other is a local
`pathlib.Path`. Both offer the same calls (`/`, open, read/write, exists, mkdir,
iterdir); buckets stay on fsspec with TensorFlow installed too (`EPATH_USE_TF`
below). What object storage lacks (appending, renaming in one step) the callers
work around through `is_remote`. Orbax reaches buckets itself, through tensorstore:
`s3_kvstore` is where tensorstore finds an S3 bucket's endpoint and region.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from flax_transformer.errors import ConfigError

# scheme -> (the fsspec client it needs, the extra that installs it)
CLIENTS = {"gs": ("gcsfs", "gcs"), "s3": ("s3fs", "s3")}

# etils picks tf.io.gfile for every bucket path once it finds TensorFlow installed,
# unless EPATH_USE_TF says no; it decides at the first bucket path in the process and
# keeps that. Said here, before any: gcsfs and s3fs (what the extras install, the
# endpoints and credentials the tests exercise) for every epath.Path, orbax's too.
os.environ.setdefault("EPATH_USE_TF", "false")


def as_path(location: str | os.PathLike) -> Any:
  """A pathlib.Path for a local location; an epath.Path for gs://... or s3://...."""
  if not isinstance(location, (str, os.PathLike)):
    return location  # Already an epath.Path.
  text = os.fspath(location)
  scheme = text.split("://", 1)[0] if "://" in text else ""
  if not scheme:
    return Path(text)
  if scheme not in CLIENTS:
    raise ConfigError(f"{text}: unsupported storage scheme {scheme}:// (local paths, gs:// and "
                      "s3:// are)")
  client, extra = CLIENTS[scheme]
  if importlib.util.find_spec(client) is None:
    raise ConfigError(f"{text}: {scheme}:// paths need {client}; install it with "
                      f"pip install 'flax-transformer[{extra}]'")
  from etils import epath
  from etils.epath import backend

  path = epath.Path(text)
  # Private to etils (tests/test_private_apis.py checks it is there).
  if getattr(path, "_backend", backend.fsspec_backend) is not backend.fsspec_backend:
    raise ConfigError(f"{text}: etils sends {scheme}:// through TensorFlow's tf.io.gfile "
                      f"(EPATH_USE_TF={os.environ.get('EPATH_USE_TF', '')!r}, or decided before "
                      "flax_transformer.storage was imported); this package reads and writes "
                      f"buckets through {client}: set EPATH_USE_TF=false")
  return path


def s3_kvstore(location: str) -> dict:
  """TensorStore's kvstore spec for an s3://BUCKET/PREFIX location.

  TensorStore's S3 driver reads credentials from the usual AWS variables and files
  but not the endpoint, so the one botocore and s3fs use (AWS_ENDPOINT_URL_S3, then
  AWS_ENDPOINT_URL: an S3-compatible store such as MinIO or Ceph) is passed here, and
  the region from AWS_REGION / AWS_DEFAULT_REGION when set.
  """
  bucket, _, prefix = location.removeprefix("s3://").partition("/")
  spec = {"driver": "s3", "bucket": bucket, "path": prefix.strip("/") + "/" if prefix else ""}
  endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
  if endpoint:
    spec["endpoint"] = endpoint
  region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
  if region:
    spec["aws_region"] = region
  return spec


def drop_cached_listings(location) -> None:
  """Drops what fsspec remembers of a bucket's listings, so objects that another
  process wrote since are seen (a no-op for local paths)."""
  text = os.fspath(location) if isinstance(location, (str, os.PathLike)) else str(location)
  if is_remote(text):
    from etils.epath import backend

    backend.fsspec_backend.fs(text).invalidate_cache()  # The filesystem epath.Path uses.


def is_remote(path) -> bool:
  return "://" in os.fspath(path) if isinstance(path, (str, os.PathLike)) else True


def write_atomically(path, data: str | bytes) -> None:
  """Writes `path` whole or not at all: local files through a rename (a reader or a
  crash never sees half of it); objects in a bucket are replaced whole by the store."""
  path = as_path(path)
  mode = "w" if isinstance(data, str) else "wb"
  if is_remote(path):
    with path.open(mode) as f:
      f.write(data)
    return
  partial = path.with_name(path.name + ".partial")
  try:
    with open(partial, mode) as f:
      f.write(data)
    os.replace(partial, path)
  finally:
    partial.unlink(missing_ok=True)


def create_exclusively(path, data: str) -> bool:
  """Writes `path` only if it does not exist yet, as one step (O_EXCL locally; a bucket's
  conditional upload: GCS's ifGenerationMatch=0, S3's If-None-Match); false if it did.

  ConfigError when the bucket's client predates exclusive writes (fsspec's "xb" mode:
  gcsfs and s3fs 2024.12.0).
  """
  path = as_path(path)
  try:
    if is_remote(path):
      from etils.epath import backend

      try:
        f = backend.fsspec_backend.fs(str(path)).open(str(path), "xb")
      except (NotImplementedError, ValueError) as e:  # fsspec < 2024.12: "File mode not supported"
        client, extra = CLIENTS[str(path).split("://", 1)[0]]
        raise ConfigError(f"{path}: {client} cannot create a file exclusively ({e}): upgrade it "
                          f"to 2024.12.0 or later (pip install -U '{client}>=2024.12.0', or "
                          f"'flax-transformer[{extra}]')") from e
      with f:
        f.write(data.encode())
    else:
      with open(path, "x", encoding="utf-8") as f:
        f.write(data)
  except FileExistsError:
    return False
  return True


def local_staging_dir(destination, prefix: str) -> str:
  """Where a tool that writes only local files (tensorboardX, jax's profiler) should
  write for `destination`: that directory itself, or for a bucket a fresh temporary
  one, which `upload_tree` copies there."""
  if is_remote(destination):
    return tempfile.mkdtemp(prefix=prefix)
  return os.fspath(destination)


def upload_tree(local: str, destination) -> None:
  """Copies every file under `local` to the same relative path under `destination`
  (whole files: objects are replaced, never appended to); nothing when `local` is
  `destination` itself."""
  if local == os.fspath(destination):
    return
  destination = as_path(destination)
  for f in Path(local).rglob("*"):
    if f.is_file():
      copy_file(f, destination / str(f.relative_to(local)))


def copy_file(source, destination) -> None:
  """One file, between any two locations (local or bucket)."""
  source, destination = as_path(source), as_path(destination)
  if not is_remote(source) and not is_remote(destination):
    destination.parent.mkdir(parents=True, exist_ok=True)  # A file of a workdir's folder.
    shutil.copy2(source, destination)
    return
  destination.write_bytes(source.read_bytes())


def remove(path) -> None:
  """Deletes a file or a whole folder, local or in a bucket."""
  if is_remote(path):
    path.rmtree() if path.is_dir() else path.unlink()
  elif path.is_dir():
    shutil.rmtree(path)
  else:
    path.unlink()


def tensorstore_reaches_s3() -> None:
  """Has orbax hand s3:// checkpoint directories to TensorStore's S3 driver.

  orbax (0.12) builds TensorStore specs for local paths and gs:// only
  (`tensorstore_utils.build_kvstore_tspec`), and would take s3://B/P for a relative
  local path. The wrapper asks orbax for the spec of gs://B/P, which keeps its format
  (OCDBT per process, write options, read coalescing), and swaps the GCS store for
  the S3 one (`s3_kvstore`). Checked against orbax-checkpoint 0.12.3 (pyproject's floor,
  .ci/lowest_bounds) and 0.12.8; tests/test_private_apis.py checks the function exists.
  """
  import orbax.checkpoint as ocp

  try:  # orbax's internals: a version without them says so instead of writing elsewhere.
    from orbax.checkpoint._src.serialization import tensorstore_utils

    build = tensorstore_utils.build_kvstore_tspec
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"s3:// checkpoints need orbax-checkpoint's tensorstore_utils."
                      f"build_kvstore_tspec, which orbax-checkpoint {ocp.__version__} lacks "
                      f"({e}); use a gs:// or local workdir, or orbax-checkpoint 0.12") from None
  if getattr(build, "reaches_s3", False):
    return

  def for_s3(gcs_store: dict) -> dict:
    rest = {k: v for k, v in gcs_store.items() if k not in ("driver", "bucket", "path")}
    return {**rest, **s3_kvstore(f"s3://{gcs_store['bucket']}/{gcs_store['path']}")}

  def build_with_s3(directory, *args, **kwargs):
    directory = str(directory)
    if not directory.startswith("s3://"):
      return build(directory, *args, **kwargs)
    spec = build("gs://" + directory.removeprefix("s3://"), *args, **kwargs)
    if spec.get("driver") == "ocdbt":
      return {**spec, "base": for_s3(spec["base"])}
    return for_s3(spec)

  build_with_s3.reaches_s3 = True
  tensorstore_utils.build_kvstore_tspec = build_with_s3
