"""Device mesh and logical-axis sharding: parameters and batches placed by rules alone.

Mesh axes: 'data' (batch), 'fsdp' (batch, and parameters' `embed` dimension),
'tensor' (heads, mlp and vocab dimensions). Rules map logical axis names
(carried by every parameter, see `attention`, `layers`) to mesh axes.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from flax_transformer.errors import ShardingConfigError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_config: Mapping[str, int], device_count: int) -> tuple[int, ...]:
  """Sizes of MESH_AXES from `config.mesh`; one axis may be -1 (all the rest)."""
  unknown = sorted(set(mesh_config) - set(MESH_AXES))
  if unknown:
    raise ShardingConfigError(f"config.mesh has unknown axis {unknown}; axes: {MESH_AXES}")
  sizes = [int(mesh_config.get(axis, 1)) for axis in MESH_AXES]
  if sum(s == -1 for s in sizes) > 1:
    raise ShardingConfigError("config.mesh: only one axis may be -1")
  if any(s == 0 or s < -1 for s in sizes):
    raise ShardingConfigError(f"config.mesh sizes must be positive or -1, got {dict(mesh_config)}")
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if device_count % fixed:
      raise ShardingConfigError(
          f"config.mesh={dict(mesh_config)}: fixed axes multiply to {fixed}, which does not "
          f"divide the {device_count} devices; choose sizes whose product divides {device_count}")
    sizes[sizes.index(-1)] = device_count // fixed
  if math.prod(sizes) != device_count:
    raise ShardingConfigError(
        f"config.mesh={dict(mesh_config)} needs {math.prod(sizes)} devices but "
        f"{device_count} are present; set one axis to -1 or make the product {device_count}")
  return tuple(sizes)


def make_mesh(mesh_config: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(devices if devices is not None else jax.devices())
  shape = mesh_shape(mesh_config, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def data_parallel_size(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows split over the data-parallel axes, everything else replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def logical_shardings(abstract_tree: Any, mesh: Mesh, rules: Sequence[tuple[str, Any]]):
  """NamedShardings for a tree whose leaves may be `nn.Partitioned` (logical names).

  Unnamed leaves (step counters, optimizer scalars) are replicated.
  """
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, [tuple(r) for r in rules])


def check_even_splits(boxed_tree: Any, shardings: Any,
                      notes: Mapping[str, str] | None = None) -> None:
  """Refuses a mesh that splits some array's dimension unevenly (jax places none such):
  e.g. a model vocabulary of 511 (an imported model's) over a tensor axis of 2.
  boxed_tree: arrays or ShapeDtypeStructs, `nn.Partitioned` where they carry logical axis
  names; shardings: NamedShardings, the same tree; notes: a logical axis name -> the
  sentence its refusal ends with."""
  is_boxed = lambda leaf: isinstance(leaf, nn.Partitioned)  # noqa: E731
  leaves = jax.tree_util.tree_leaves_with_path(boxed_tree, is_leaf=is_boxed)
  for (path, leaf), sharding in zip(leaves, jax.tree_util.tree_leaves(shardings)):
    names = leaf.names if is_boxed(leaf) else ()
    shape = nn.unbox(leaf).shape
    for i, (size, axes) in enumerate(zip(shape, sharding.spec)):
      axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
      parts = math.prod(sharding.mesh.shape[a] for a in axes)
      if size % parts:
        note = (notes or {}).get(names[i] if i < len(names) else None, "")
        raise ShardingConfigError(
            f"parameter {jax.tree_util.keystr(path)} {list(shape)}: its dimension of "
            f"{size} does not split over mesh axes {'x'.join(axes)} ({parts} devices); choose "
            "config.mesh sizes that divide it, or map its logical axis to None in "
            f"config.logical_axis_rules{note}")


def check_divisible(batch_rows: int, mesh: Mesh, key: str = "batch_tokens",
                    micro_batches: int = 1) -> None:
  """Refuses a global batch that does not split evenly over the data-parallel devices,
  and then into `micro_batches` (config.grad_accum_steps) on each."""
  size = data_parallel_size(mesh)
  if batch_rows % size:
    raise ShardingConfigError(
        f"global batch of {batch_rows} rows is not divisible by the data-parallel size {size} "
        f"(mesh data x fsdp); change config.{key} or config.mesh")
  if batch_rows % (size * micro_batches):
    raise ShardingConfigError(
        f"global batch of {batch_rows} rows does not split into "
        f"config.grad_accum_steps={micro_batches} micro-batches over {size} data-parallel "
        "devices")
