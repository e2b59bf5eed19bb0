"""The feed-forward layer's activation (paper eq. 2: relu), one table for every reader.

Each row: what the network computes (`layers.FeedForward`), the names transformers'
config.json gives it (ACT2FN: an import accepts any, the Marian export writes the first),
and CTranslate2's (`ctranslate2.specs.common_spec.Activation`; None where it has none,
which that export refuses). Adding an activation is one row here (and its test).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax


@dataclasses.dataclass(frozen=True)
class Activation:
  fn: Callable[[jax.Array], jax.Array]
  transformers: tuple[str, ...]  # config.json's activation_function names; the first written.
  ctranslate2: str | None  # common_spec.Activation's member, or None: CTranslate2 has none.


ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(jax.nn.relu, ("relu",), "RELU"),
    "swish": Activation(jax.nn.swish, ("swish", "silu"), "SWISH"),
    "gelu": Activation(functools.partial(jax.nn.gelu, approximate=False), ("gelu",), "GELU"),
    "gelu_tanh": Activation(functools.partial(jax.nn.gelu, approximate=True),
                            ("gelu_pytorch_tanh", "gelu_new"), "GELUTanh"),
}
# transformers' activation_function -> TransformerConfig.activation (what an import reads).
FROM_TRANSFORMERS = {name: ours for ours, row in ACTIVATIONS.items() for name in row.transformers}
