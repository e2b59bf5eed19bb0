"""M2M100 and NLLB-200 imports compute transformers' function: the tiny models and
references of tests/fixtures/make_m2m100.py (made with transformers and torch; none is
needed here), imported by import_model.py, give the same token ids (the source's language
token placed as each tokenizer places it), logits (1e-4), summed log-probabilities (1e-3),
greedy outputs and beam-4 outputs (length_penalty=0) for three target languages from one
English source, the target language forced as the decoder's first output."""

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from flax_transformer.averaging import load_params
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.network.model import Transformer
from flax_transformer.pretrained import convert, importer
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator
from flax_transformer.workdir import languages as workdir_languages
from flax_transformer.workdir import read_run

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
# nllb_v4: the nllb model and tokenizer saved by transformers 4.57 (its slow NllbTokenizer:
# tokenizer_config.json's added_tokens_decoder, no tokenizer.json), its references made there.
MODELS = ("m2m100", "nllb", "nllb_v4")
# Multi30k's code -> each model's language token, and its code in the languages record.
TOKENS = {"m2m100": {"en": "__en__", "de": "__de__", "fr": "__fr__"},
          "nllb": {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn"}}
TOKENS["nllb_v4"] = TOKENS["nllb"]
CODES = {"m2m100": {"en": "en", "de": "de", "fr": "fr"}, "nllb": TOKENS["nllb"],
         "nllb_v4": TOKENS["nllb"]}


@pytest.fixture(scope="module", params=MODELS)
def imported(request, tmp_path_factory):
  """(name, fixture folder, workdir, references, transformers' ids -> ours)."""
  folder = FIXTURES / request.param
  workdir = tmp_path_factory.mktemp(request.param) / "run"
  importer.import_model(folder, workdir)
  ref = json.loads((folder / "references.json").read_text(encoding="utf-8"))
  config = json.loads((folder / "config.json").read_text())
  # The import's permutation: pad, EOS, unknown first, every other id in its order.
  order = convert.project_order(config["vocab_size"], pad=1, eos=2, unk=3)
  theirs_to_ours = np.argsort(order)
  return request.param, folder, workdir, ref, theirs_to_ours


def tagged(name: str, lang: str, text: str) -> str:
  """`text` with the language's token first, as the source side reads a source's language
  (and the target side reads a target's token)."""
  return f"{TOKENS[name][lang]} {text}"


def test_token_ids_are_transformers(imported):
  name, _, workdir, ref, to_ours = imported
  _, tokenizer = read_run(workdir)
  for source, target, lang, source_ids, target_ids in zip(
      ref["sources"], ref["targets"], ref["target_langs"], ref["source_ids"],
      ref["target_ids"]):
    want = to_ours[source_ids].tolist()
    assert tokenizer.source.tokenize(tagged(name, "en", source)).tolist() == want
    assert tokenizer.source.tokenize(source).tolist() == want  # English: src_lang.
    assert tokenizer.target.tokenize(tagged(name, lang, target)).tolist() == (
        to_ours[target_ids].tolist())
    assert tokenizer.target.tokenize(target).tolist() == to_ours[target_ids[1:]].tolist()
  languages = workdir_languages(workdir)
  assert languages.target_by == "decoder_prefix"
  assert {TOKENS[name][lang] for lang in ("en", "de", "fr")} <= set(
      languages.target_tokens.values())


@pytest.mark.parametrize("name", ["m2m100", "nllb"])
def test_tokenizer_corners_are_transformers(name, tmp_path):
  """Special tokens' strings inside a text, spaces kept (NLLB's tokenizers pipeline, what
  transformers 5 and 4's fast tokenizer run, keeps a trailing one as a piece) or dropped
  (M2M100's sentencepiece), unicode, a language code inside a text, '<mask>' taking the
  space before it."""
  importer.import_model(FIXTURES / name, tmp_path / "run")
  _, tokenizer = read_run(tmp_path / "run")
  ref = json.loads((FIXTURES / name / "references.json").read_text(encoding="utf-8"))
  config = json.loads((FIXTURES / name / "config.json").read_text())
  to_ours = np.argsort(convert.project_order(config["vocab_size"], pad=1, eos=2, unk=3))
  assert len(ref["edge_texts"]) == len(ref["edge_source_ids"]) >= 9
  for text, ids in zip(ref["edge_texts"], ref["edge_source_ids"]):
    assert tokenizer.source.tokenize(text).tolist() == to_ours[ids].tolist(), text


def test_nllb_legacy_behaviour_puts_the_source_language_after_eos(tmp_path):
  """tokenizer_config.json's legacy_behaviour=true: pieces, EOS, then the language code."""
  import shutil
  folder = tmp_path / "nllb"
  shutil.copytree(FIXTURES / "nllb", folder)
  config = json.loads((folder / "tokenizer_config.json").read_text())
  (folder / "tokenizer_config.json").write_text(json.dumps(dict(config, legacy_behaviour=True)))
  importer.import_model(folder, tmp_path / "run")
  _, tokenizer = read_run(tmp_path / "run")
  ref = json.loads((folder / "references.json").read_text(encoding="utf-8"))
  to_ours = np.argsort(convert.project_order(len(json.loads(
      (tmp_path / "run" / "tokenizer" / "vocab.json").read_text())), pad=1, eos=2, unk=3))
  sources = ref["sources"][::3]
  assert len(ref["legacy_source_ids"]) == len(sources) > 0
  for source, ids in zip(sources, ref["legacy_source_ids"]):
    assert tokenizer.source.tokenize(tagged("nllb", "en", source)).tolist() == (
        to_ours[ids].tolist())


def test_logits_within_1e4(imported):
  _, folder, workdir, ref, to_ours = imported
  model_config, _ = read_run(workdir)
  params, _ = load_params(workdir, model_config)
  model = Transformer(model_config.replace(deterministic=True))
  with np.load(folder / "logits.npz") as theirs:
    expected = {int(key.split("_")[1]): theirs[key] for key in theirs.files}
  rows = sorted(expected)
  inputs, targets = (np.zeros((len(rows), max(len(ref[key][i]) for i in rows)), np.int32)
                     for key in ("source_ids", "target_ids"))
  for row, i in enumerate(rows):
    inputs[row, :len(ref["source_ids"][i])] = to_ours[ref["source_ids"][i]]
    targets[row, :len(ref["target_ids"][i])] = to_ours[ref["target_ids"][i]]
  logits = np.asarray(jax.jit(model.apply)({"params": params}, inputs, targets))
  for row, i in enumerate(rows):
    np.testing.assert_allclose(logits[row, :len(ref["target_ids"][i])][:, to_ours],
                               expected[i], atol=1e-4, rtol=0)


def translator(workdir, **search) -> Translator:
  """Whole batches of 576 tokens: one shape per width (32 to 80: 18 to 7 rows), the
  same for every call of a search (ids or texts, all rows or some), so each search and
  the scoring compile once per width."""
  return Translator.from_workdir(workdir, search=SearchConfig(max_extra=20, **search),
                                 devices=jax.devices()[:1], batch_tokens=576,
                                 whole_batches=True)


def test_score_greedy_and_beam_are_transformers_for_three_targets(imported):
  """From each English source into DE, FR and EN, the target per row (one batch): the
  target's token forced first, as generate's forced_bos_token_id."""
  name, _, workdir, ref, to_ours = imported
  assert ref["max_extra"] == 20 and sorted(set(ref["target_langs"])) == ["de", "en", "fr"]
  assert ref["transformers"].startswith("4.57" if name == "nllb_v4" else "5.")
  codes = CODES[name]
  greedy = translator(workdir, beam_size=1)
  source_ids = [to_ours[ids].astype(np.int32) for ids in ref["source_ids"]]
  scores = greedy.score_ids(source_ids, [to_ours[ids].astype(np.int32)
                                         for ids in ref["target_ids"]])
  np.testing.assert_allclose([s for s, _ in scores], ref["log_probs"], atol=1e-3, rtol=0)
  # Through the languages record (run.json): texts, a target per row. Its pairs leave out a
  # language into itself, which the rows into English from English are.
  rows = [i for i, lang in enumerate(ref["target_langs"]) if lang != "en"]
  sources = [ref["sources"][i] for i in rows]
  targets = [codes[ref["target_langs"][i]] for i in rows]
  scores = greedy.score(sources, [ref["targets"][i] for i in rows], source_lang=codes["en"],
                        target_lang=targets)
  np.testing.assert_allclose([s for s, _ in scores], [ref["log_probs"][i] for i in rows],
                             atol=1e-3, rtol=0)

  def theirs(outputs):  # Their ids -> ours, without the EOS the search does not return.
    return [to_ours[ids].tolist()[:-1] if ids and to_ours[ids[-1]] == EOS_ID
            else to_ours[ids].tolist() for ids in outputs]

  forced = [to_ours[ids[:1]].astype(np.int32) for ids in ref["target_ids"]]
  found = greedy.translate_nbest_ids(source_ids, prefixes=forced)
  assert [h[0][0] for h in found] == theirs(ref["greedy"])
  texts = [h[0][0] for h in greedy.translate_nbest(sources, source_lang=codes["en"],
                                                   target_lang=targets)]
  # M2M100Tokenizer.decode keeps its '__de__' token in the text (not a special token to it).
  assert texts == [t.split(" ", 1)[1] if name == "m2m100" and t.startswith("__") else t
                   for t in (ref["greedy_text"][i] for i in rows)]

  beam = translator(workdir, beam_size=4, alpha=0.0, eos_within_beam=True)
  found = beam.translate_nbest_ids(source_ids, prefixes=forced)
  # Every line (one that ended at its length limit would be scored as the search scores
  # it: make_pretrained.eos_at_limit).
  assert [h[0][0] for h in found] == theirs(ref["beam4"])
  # generate's forced token scores 0 (its logits processor), ours its log-probability:
  # every hypothesis of a sentence starts with it, so the ranking is the same and the scores
  # differ by that one log-probability (teacher-forced: the first target token's).
  first = [s for s, _ in greedy.score_ids(source_ids, forced)]  # Teacher-forced.
  np.testing.assert_allclose([h[0][1] - f for h, f in zip(found, first)], ref["beam4_scores"],
                             atol=1e-3, rtol=0)


def test_bf16_tensors_import_as_stored_or_cast(tmp_path):
  """A bf16 model.safetensors: --dtype=stored keeps bf16 (the model's param_dtype), the
  default casts to float32; either way the values are the stored ones. Several dtypes in
  one file with --dtype=stored is one line."""
  import shutil

  import ml_dtypes
  from safetensors.numpy import load_file, save_file

  from flax_transformer.errors import DataError
  folder = tmp_path / "nllb_bf16"
  shutil.copytree(FIXTURES / "nllb", folder)
  tensors = load_file(str(folder / "model.safetensors"))
  halved = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
  save_file(halved, str(folder / "model.safetensors"))
  results = {}
  for dtype in ("stored", "float32"):
    importer.import_model(folder, tmp_path / dtype, dtype=dtype)
    model_config, _ = read_run(tmp_path / dtype)
    results[dtype] = (model_config, load_params(tmp_path / dtype, model_config)[0])
  assert results["stored"][0].param_dtype == np.dtype(ml_dtypes.bfloat16)
  assert results["float32"][0].param_dtype == np.float32
  stored = results["stored"][1]["encoder"]["layer_0"]["ffn"]["w1"]["kernel"]
  cast = results["float32"][1]["encoder"]["layer_0"]["ffn"]["w1"]["kernel"]
  assert stored.dtype == ml_dtypes.bfloat16 and cast.dtype == np.float32
  np.testing.assert_array_equal(np.asarray(stored, np.float32), cast)
  np.testing.assert_array_equal(cast, halved["model.encoder.layers.0.fc1.weight"].astype(
      np.float32).T)
  mixed = dict(halved, **{"model.encoder.layer_norm.weight":
                          tensors["model.encoder.layer_norm.weight"]})
  save_file(mixed, str(folder / "model.safetensors"))
  with pytest.raises(DataError, match="several dtypes"):
    importer.import_folder(folder, dtype="stored")


def test_a_sharded_save_imports_as_the_whole_file(tmp_path):
  """A sharded save (model-0000i-of-00003.safetensors and model.safetensors.index.json,
  as save_pretrained writes a model over max_shard_size: transformers 4.x shards at 5 GB,
  NLLB-1.3B and 3.3B so) imports to the parameters of the one-file save; a missing shard,
  an index that misplaces a tensor and sharded pytorch_model-*.bin files are one line."""
  import shutil

  from safetensors.numpy import load_file, save_file

  from flax_transformer.errors import DataError
  folder = tmp_path / "nllb_sharded"
  shutil.copytree(FIXTURES / "nllb", folder)
  tensors = load_file(str(folder / "model.safetensors"))
  (folder / "model.safetensors").unlink()
  names = sorted(tensors)
  weight_map = {}
  for i, part in enumerate((names[:30], names[30:60], names[60:])):
    shard = f"model-{i + 1:05d}-of-00003.safetensors"
    save_file({name: tensors[name] for name in part}, str(folder / shard),
              metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(part, shard))
  index = folder / "model.safetensors.index.json"
  index.write_text(json.dumps({"metadata": {"total_size": sum(
      t.nbytes for t in tensors.values())}, "weight_map": weight_map}, indent=2))
  for name, source in (("whole", FIXTURES / "nllb"), ("sharded", folder)):
    importer.import_model(source, tmp_path / name)
  params = {}
  for name in ("whole", "sharded"):
    model_config, _ = read_run(tmp_path / name)
    params[name] = load_params(tmp_path / name, model_config)[0]
  jax.tree.map(np.testing.assert_array_equal, params["whole"], params["sharded"])
  moved = dict(weight_map, **{names[0]: "model-00002-of-00003.safetensors"})
  for change, named in (
      (lambda: index.write_text(json.dumps({"weight_map": moved})),
       f"tensor '{names[0]}' is in model-00001-of-00003.safetensors, the index names "
       "model-00002-of-00003.safetensors"),
      (lambda: (folder / "model-00003-of-00003.safetensors").unlink(),
       "model-00003-of-00003.safetensors not found (named by model.safetensors.index.json)"),
      (lambda: (index.unlink(), (folder / "pytorch_model.bin.index.json").write_text("{}")),
       "sharded pytorch_model-*.bin files but no safetensors")):
    change()
    with pytest.raises(DataError, match=re.escape(named)) as error:
      importer.import_folder(folder)
    assert "\n" not in str(error.value)


def test_the_vocabulary_is_padded_to_split_and_the_padding_is_never_produced(tmp_path):
  """409 ids split over no tensor axis of 2, 4 or 8: the import pads to 512 rows whose
  logits are -inf (no probability, never an output, no gradient)."""
  importer.import_model(FIXTURES / "nllb", tmp_path / "run")
  model_config, tokenizer = read_run(tmp_path / "run")
  assert (model_config.vocab_size, model_config.vocab_padding) == (512, 512 - 409)
  assert tokenizer.target.vocab_size == 512
  params, _ = load_params(tmp_path / "run", model_config)
  model = Transformer(model_config.replace(deterministic=True))
  source = tokenizer.source.tokenize("A man in a red shirt.")[None]
  target = tokenizer.target.tokenize("deu_Latn Ein Mann.")[None]

  def loss(p):
    logits = model.apply({"params": p}, source, target)
    return -jax.nn.log_softmax(logits)[0, 0, target[0, 0]], logits

  grads, logits = jax.jit(jax.grad(loss, has_aux=True))(params)  # Eager: 5x the time.
  assert np.all(np.isneginf(np.asarray(logits)[..., 409:]))
  assert np.all(np.isfinite(np.asarray(logits)[..., :409]))
  assert not np.any(np.asarray(grads["shared_embedding"]["embedding"])[409:])
  assert tokenizer.target.detokenize(list(range(409, 512)) + [EOS_ID]) == ""


@pytest.mark.devices(8)
def test_eight_devices_fsdp_by_tensor_equal_one_device(tmp_path):
  """The padded vocabulary splits over the tensor axis: on a mesh fsdp 4 x tensor 2, the
  imported NLLB's parameters placed by the training rules (vocabulary and heads over
  'tensor'), beam-4 outputs and scores into three targets equal one device's."""
  from flax import linen as nn
  from configs import tiny

  from flax_transformer.training import sharding as sharding_lib
  from flax_transformer.training.steps import Trainer
  from flax_transformer.translation.programs import make_score_fn, make_search_fn

  importer.import_model(FIXTURES / "nllb", tmp_path / "run")
  model_config, _ = read_run(tmp_path / "run")
  params, _ = load_params(tmp_path / "run", model_config)
  ref = json.loads((FIXTURES / "nllb" / "references.json").read_text(encoding="utf-8"))
  to_ours = np.argsort(convert.project_order(409, pad=1, eos=2, unk=3))
  rows = range(8)  # Eight sentences: DE, FR and EN targets of the first sources.
  inputs, prefix, targets = (np.zeros((8, max(len(ref["source_ids"][i]) for i in rows)),
                                      np.int32), np.zeros((8, 1), np.int32),
                             np.zeros((8, max(len(ref["target_ids"][i]) for i in rows)),
                                      np.int32))
  for row in rows:
    inputs[row, :len(ref["source_ids"][row])] = to_ours[ref["source_ids"][row]]
    targets[row, :len(ref["target_ids"][row])] = to_ours[ref["target_ids"][row]]
    prefix[row, 0] = to_ours[ref["target_ids"][row][0]]
  search = SearchConfig(beam_size=4, alpha=0.0, max_extra=20, eos_within_beam=True)
  search_fn, score_fn = jax.jit(make_search_fn(model_config, search)), jax.jit(
      make_score_fn(model_config))
  one_device = jax.device_put(params, jax.devices()[0])
  one = search_fn(one_device, inputs, jax.random.PRNGKey(0), prefix)
  one_scores = score_fn(one_device, inputs, targets)

  mesh = sharding_lib.make_mesh({"fsdp": 4, "tensor": 2})
  trainer = Trainer(model_config, tiny.get_config(), mesh)
  placed = jax.device_put(params, trainer.state_shardings.params)
  embedding = placed["shared_embedding"]["embedding"]
  assert embedding.sharding.spec[0] == "tensor"  # The vocabulary is split.
  with jax.set_mesh(mesh), nn.logical_axis_rules(trainer.rules):
    batch = jax.device_put(inputs, trainer.batch_sharding)
    sharded = search_fn(placed, batch, jax.random.PRNGKey(0),
                        jax.device_put(prefix, trainer.batch_sharding))
    sharded_scores = score_fn(placed, batch, jax.device_put(targets, trainer.batch_sharding))
  np.testing.assert_array_equal(sharded.sequences, one.sequences)
  np.testing.assert_allclose(sharded.scores, one.scores, atol=1e-4)
  np.testing.assert_allclose(jax.tree.leaves(sharded_scores), jax.tree.leaves(one_scores),
                             atol=1e-4)
  best = np.asarray(sharded.sequences)[:, 0]
  for i in rows:  # transformers' beam output, too.
    want = to_ours[ref["beam4"][i]].tolist()
    got = best[i][best[i] != 0].tolist()
    assert got == want, i


def test_clean_up_tokenization_spaces_true_is_applied_on_decode(tmp_path):
  """A tokenizer_config.json with clean_up_tokenization_spaces=true (transformers 4.3x
  saved NLLB's so): outputs written as transformers 4.57's decode writes them then."""
  import shutil
  folder = tmp_path / "nllb_v4"
  shutil.copytree(FIXTURES / "nllb_v4", folder)
  config = json.loads((folder / "tokenizer_config.json").read_text())
  (folder / "tokenizer_config.json").write_text(json.dumps(
      dict(config, clean_up_tokenization_spaces=True)))
  importer.import_model(folder, tmp_path / "run")
  _, tokenizer = read_run(tmp_path / "run")
  ref = json.loads((folder / "references.json").read_text(encoding="utf-8"))
  to_ours = np.argsort(convert.project_order(409, pad=1, eos=2, unk=3))
  assert len(ref["cleanup_ids"]) == len(ref["cleanup_text"]) == 2
  for ids, text in zip(ref["cleanup_ids"], ref["cleanup_text"]):
    assert tokenizer.target.detokenize(to_ours[ids].tolist()) == text
