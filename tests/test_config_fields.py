"""One table per fact: the activations (network/activations.py) and the model config's
fields (network/config_fields.py) that the network, every importer and both exports read."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

from flax_transformer.errors import ConfigError
from flax_transformer.export import ct2
from flax_transformer.export import m2m100 as m2m100_export
from flax_transformer.export import marian as marian_export
from flax_transformer.network import config as config_lib
from flax_transformer.network import config_fields
from flax_transformer.network.activations import ACTIVATIONS, FROM_TRANSFORMERS
from flax_transformer.network.config import TransformerConfig
from flax_transformer.pretrained import importer

FIXTURES = ROOT / "tests" / "fixtures"
IMPORTED = ("marian_swish_shared", "marian_gelu_separate", "fsmt", "m2m100", "nllb")


def _erf_gelu(x):
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


# The definitions (not our code): what each name computes.
REFERENCE = {
    "relu": lambda x: np.maximum(x, 0),
    "swish": lambda x: x / (1 + np.exp(-x)),
    "gelu": _erf_gelu,
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_each_activation_row_is_one_function_under_every_name(name):
  """The network computes the definition; an import reads each of its transformers names
  as it, a Marian export writes a name that reads back as it, and CTranslate2's name is
  one of its Activation members (or None: that export refuses it)."""
  row = ACTIVATIONS[name]
  x = np.linspace(-6, 6, 97).astype(np.float32)
  np.testing.assert_allclose(np.asarray(row.fn(jnp.asarray(x))), REFERENCE[name](x),
                             rtol=1e-5, atol=1e-6)
  assert all(FROM_TRANSFORMERS[n] == name for n in row.transformers)
  assert marian_export.marian_config(TransformerConfig(activation=name))[
      "activation_function"] in row.transformers
  ct2_members = ("RELU", "GELUTanh", "SWISH", "GELU", "GELUSigmoid", "Tanh", "Sigmoid")
  assert row.ctranslate2 is None or row.ctranslate2 in ct2_members
  TransformerConfig(activation=name)  # The config accepts every row.


def test_every_config_field_is_classified_once():
  names = {f.name for f in dataclasses.fields(TransformerConfig)}
  assert not config_fields.COMPUTED_FIELDS & config_fields.NOT_COMPUTED_FIELDS
  assert names <= config_fields.COMPUTED_FIELDS | config_fields.NOT_COMPUTED_FIELDS


def _with_new_field(default=False):
  """TransformerConfig with one more field, as a change to the model would add it."""
  return dataclasses.make_dataclass(
      "TransformerConfig", [("rotary_positions", bool, dataclasses.field(default=default))],
      bases=(TransformerConfig,), frozen=True)


EXPORTS = [marian_export.check, ct2.check, m2m100_export.check]
EXPORT_NAMES = ["marian", "ct2", "m2m100"]
# A model each export writes, but for the field under test.
EXPORTABLE = {m2m100_export.check: dict(norm="pre", position_layout="halves",
                                        position_frequencies="fairseq",
                                        position_offset=2, layer_norm_epsilon=1e-5)}


@pytest.mark.parametrize("export", EXPORTS, ids=EXPORT_NAMES)
def test_a_new_config_field_is_refused_by_every_export(export):
  with pytest.raises(ConfigError, match=r"TransformerConfig\.rotary_positions is in neither"):
    export(_with_new_field()(**EXPORTABLE.get(export, {})))


@pytest.mark.parametrize("folder", IMPORTED)
def test_a_new_config_field_is_refused_by_every_importer(folder, monkeypatch):
  """Every architecture's import builds its config through one function
  (pretrained/bart_config.py), which refuses a field no import knows."""
  monkeypatch.setattr(config_lib, "TransformerConfig", _with_new_field())
  with pytest.raises(ConfigError, match=r"TransformerConfig\.rotary_positions is in neither"):
    importer.import_folder(FIXTURES / folder)


@pytest.mark.parametrize("export", EXPORTS, ids=EXPORT_NAMES)
def test_a_computed_field_an_export_does_not_write_is_refused_when_set(export, monkeypatch):
  """A classified field the export does not write: refused away from its default only."""
  monkeypatch.setattr(config_fields, "COMPUTED_FIELDS",
                      config_fields.COMPUTED_FIELDS | {"rotary_positions"})
  fields = EXPORTABLE.get(export, {})
  export(_with_new_field()(**fields))  # At its default: the function is the one exported.
  with pytest.raises(ConfigError, match=r"rotary_positions=True has no equivalent"):
    export(_with_new_field()(rotary_positions=True, **fields))
