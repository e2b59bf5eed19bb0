"""Checkpointer's save for arrays nobody changes meanwhile (an import's): written from the
caller's numpy arrays in chunks, not from orbax's copy; every reader reads it back."""

import jax
import numpy as np

from flax_transformer import checkpoints
from flax_transformer.checkpoints import Checkpointer


def test_an_uncopied_chunked_save_reads_back_equal_and_leaves_the_arrays_as_they_were(
    tmp_path, monkeypatch):
  monkeypatch.setattr(checkpoints, "CHUNK_BYTES", 4096)  # Several chunks per array.
  rng = np.random.default_rng(0)
  params = {"layer": {"kernel": rng.standard_normal((40, 96), np.float32).T,  # A view.
                      "bias": rng.standard_normal(40, np.float32)},
            "embedding": rng.standard_normal((300, 16), np.float32)}
  before = jax.tree_util.tree_map(np.copy, params)
  writer = Checkpointer(tmp_path, asynchronous=False, host_arrays_uncopied=True)
  try:
    writer.save(0, {"params": params}, force=True)
    writer.wait()
  finally:
    writer.close()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), params)
  reader = Checkpointer(tmp_path, read_only=True)
  try:
    assert reader.steps() == [0]
    restored = reader.restore_params(0, abstract)
  finally:
    reader.close()
  for got, saved, kept in zip(jax.tree_util.tree_leaves(restored),
                              jax.tree_util.tree_leaves(params),
                              jax.tree_util.tree_leaves(before)):
    np.testing.assert_array_equal(np.asarray(got), kept)
    np.testing.assert_array_equal(saved, kept)
