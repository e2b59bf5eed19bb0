"""Configs: the dataclass validates, config files hold exactly its fields."""

import dataclasses
import sys
from pathlib import Path

import pytest

from flax_transformer import TransformerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from configs import base, big, multi30k, multi30k_best, multi30k_en_fr, table3  # noqa: E402


def test_model_section_holds_exactly_the_dataclass_fields():
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  for config in [base.get_config(), big.get_config(), multi30k.get_config(),
                 multi30k_en_fr.get_config()] + [
      multi30k_best.get_config(pair) for pair in multi30k_best.STEPS] + [
      table3.get_config(row) for row in table3.ROWS]:
    assert set(config.model.to_dict()) == fields
    TransformerConfig.from_dict(config.model.to_dict())


def test_defaults_are_the_paper_base_model():
  cfg = TransformerConfig()
  assert (cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.num_heads) == (6, 512, 2048, 8)
  assert (cfg.head_dim_k, cfg.head_dim_v, cfg.dropout_rate) == (64, 64, 0.1)
  assert (cfg.norm, cfg.positional, cfg.share_embeddings) == ("post", "sinusoidal", True)
  assert cfg.attention_bias is False  # W^Q, W^K, W^V, W^O have no biases (section 3.2.2).


def test_best_recipes_hold_what_their_results_were_trained_with():
  """The settings of the runs behind RESULTS.md's best rows, by config name."""
  de, fr = multi30k_best.get_config("en-de"), multi30k_best.get_config("en-fr")
  for config, steps, lang in ((de, 9000, "de"), (fr, 7000, "fr")):
    assert (config.target_lang, config.num_train_steps) == (lang, steps)
    assert (config.model.dropout_rate, config.subword_sampling_alpha) == (0.2, 0.02)
    assert config.model.attention_bias and config.keep_checkpoints == 10
  assert multi30k_en_fr.get_config().target_lang == "fr"
  with pytest.raises(ValueError, match="unknown pair 'en-xx'"):
    multi30k_best.get_config("en-xx")


def test_table3_rows_change_what_the_paper_says():
  a1 = TransformerConfig.from_dict(table3.get_config("A1").model.to_dict())
  assert (a1.num_heads, a1.head_dim_k, a1.head_dim_v) == (1, 512, 512)
  b16 = TransformerConfig.from_dict(table3.get_config("B16").model.to_dict())
  assert (b16.head_dim_k, b16.head_dim_v) == (16, 64)
  c256 = TransformerConfig.from_dict(table3.get_config("C256").model.to_dict())
  assert c256.head_dim_k == 32
  assert table3.get_config("Dls2").label_smoothing == 0.2
  assert table3.get_config("E").model.positional == "learned"
  with pytest.raises(ValueError, match="Unknown Table 3 row 'Z9'"):
    table3.get_config("Z9")


def test_vocab_size_flows_into_the_model():
  config = base.get_config()
  config.vocab_size = 8000
  assert config.model.vocab_size == 8000


@pytest.mark.parametrize("changes, message", [
    ({"d_model": 100, "num_heads": 8}, "d_model=100 is not divisible by num_heads=8"),
    ({"norm": "middle"}, "norm must be one of"),
    ({"positional": "rotary"}, "positional must be one of"),
    ({"dropout_rate": 1.5}, "dropout_rate must be in"),
    ({"dtype": "float99"}, "dtype is not a dtype"),
    ({"start_from_zero_embedding": True, "decoder_start_id": 2},
     "start_from_zero_embedding starts the decoder from id 0's .* decoder_start_id=2"),
])
def test_invalid_model_config_names_the_field(changes, message):
  with pytest.raises(ValueError, match=message):
    TransformerConfig(**changes)


def test_unknown_model_key_is_named():
  with pytest.raises(ValueError, match="Unknown model config key.*d_modle"):
    TransformerConfig.from_dict({"d_modle": 3})


def test_a_record_older_than_a_model_field_refuses_a_resume_that_changes_it(tmp_path):
  """run.json written before a field existed (start_from_zero_embedding; attention_bias,
  older): its checkpoints were trained at the value that kept the old function, so a
  resume setting the field otherwise is refused naming it, and one at it goes on."""
  import json

  from flax_transformer.errors import ConfigError
  from flax_transformer.workdir import Workdir, read_record, record_run

  config = TransformerConfig(vocab_size=16, d_model=8, d_ff=16, num_heads=2, num_layers=1,
                             max_len=16)
  record_run(tmp_path, config, 16)
  record = read_record(tmp_path)
  del record["model"]["start_from_zero_embedding"], record["model"]["attention_bias"]
  Workdir(tmp_path).run_file.write_text(json.dumps(record))
  with pytest.raises(ConfigError, match="model.start_from_zero_embedding: workdir has False, "
                                        "config has True"):
    record_run(tmp_path, config.replace(attention_bias=True, start_from_zero_embedding=True), 16)
  with pytest.raises(ConfigError, match="model.attention_bias: workdir has True, config has "
                                        "False"):
    record_run(tmp_path, config, 16)
  record_run(tmp_path, config.replace(attention_bias=True), 16, launch={"n": 2})
  assert read_record(tmp_path)["launches"] == [{"n": 2}]
