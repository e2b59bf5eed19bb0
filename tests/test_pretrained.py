"""Imported Marian and FSMT models compute transformers' function: the tiny models and
references of tests/fixtures/make_pretrained.py and make_fsmt.py (made with transformers and
torch; none is needed here),
imported by import_model.py, give the same token ids, logits (1e-4), summed
log-probabilities (Translator.score, 1e-3), greedy outputs, and beam-4 outputs at the
length rule both share (SearchConfig(alpha=0) and generate(length_penalty=0): the sum of
log-probabilities). Bad folders are one line and exit 2."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.averaging import load_params
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.network.model import Transformer
from flax_transformer.pretrained import importer
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator
from flax_transformer.workdir import read_run

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
MODELS = ("marian_swish_shared", "marian_gelu_separate", "fsmt")
# Each architecture's source and target vocabulary files (a shared one: the first only).
VOCABULARIES = {"marian": ("vocab.json", "target_vocab.json"),
                "fsmt": ("vocab-src.json", "vocab-tgt.json")}


@pytest.fixture(scope="module", params=MODELS)
def imported(request, tmp_path_factory):
  """(fixture folder, workdir it was imported into, transformers' references, theirs ->
  ours id maps (source, target))."""
  folder = FIXTURES / request.param
  workdir = tmp_path_factory.mktemp(request.param) / "run"
  importer.import_model(folder, workdir)
  references = json.loads((folder / "references.json").read_text())
  return folder, workdir, references, id_maps(folder, workdir)


def id_maps(folder: Path, workdir: Path) -> list[np.ndarray]:
  """transformers' ids -> ours, (source, target), from the vocabulary files of `folder` and
  of the workdir it was imported into."""
  maps = []
  architecture = json.loads((folder / "config.json").read_text())["model_type"]
  for name in VOCABULARIES[architecture]:
    theirs = folder / name
    if not theirs.is_file():
      maps.append(maps[0])
      continue
    ours = json.loads((workdir / "tokenizer" / name).read_text())
    old = json.loads(theirs.read_text())
    table = np.zeros(len(old), np.int64)
    for piece, i in old.items():
      table[i] = ours[piece]
    maps.append(table)
  return maps


def test_token_ids_are_transformers(imported):
  folder, workdir, ref, (source_map, target_map) = imported
  _, tokenizer = read_run(workdir)
  for source, target, source_ids, target_ids in zip(ref["sources"], ref["targets"],
                                                    ref["source_ids"], ref["target_ids"]):
    assert tokenizer.source.tokenize(source).tolist() == source_map[source_ids].tolist()
    assert tokenizer.target.tokenize(target).tolist() == target_map[target_ids].tolist()
  assert any(s.startswith(">>") for s in ref["sources"]) == ("shared" in folder.name)


def test_logits_within_1e4(imported):
  folder, workdir, ref, (source_map, target_map) = imported
  model_config, _ = read_run(workdir)
  params, _ = load_params(workdir, model_config)
  model = Transformer(model_config.replace(deterministic=True))
  with np.load(folder / "logits.npz") as theirs:
    expected = {int(name.split("_")[1]): theirs[name] for name in theirs.files}
  # One batch, one compile: padding (id 0) is masked, so real positions are unchanged.
  rows = sorted(expected)
  inputs, targets = (np.zeros((len(rows), max(len(ref[key][i]) for i in rows)), np.int32)
                     for key in ("source_ids", "target_ids"))
  for row, i in enumerate(rows):
    inputs[row, :len(ref["source_ids"][i])] = source_map[ref["source_ids"][i]]
    targets[row, :len(ref["target_ids"][i])] = target_map[ref["target_ids"][i]]
  logits = np.asarray(jax.jit(model.apply)({"params": params}, inputs, targets))
  for row, i in enumerate(rows):  # Our columns in their ids' order: logits[..., map[theirs]].
    np.testing.assert_allclose(logits[row, :len(ref["target_ids"][i])][:, target_map],
                               expected[i], atol=1e-4, rtol=0)


def translator(workdir, **search) -> Translator:
  return Translator.from_workdir(workdir, search=SearchConfig(max_extra=20, **search),
                                 devices=jax.devices()[:1])


def test_score_greedy_and_beam_are_transformers(imported):
  folder, workdir, ref, (source_map, target_map) = imported
  assert ref["max_extra"] == 20
  greedy = translator(workdir, beam_size=1)
  scores = greedy.score(ref["sources"], ref["targets"])
  np.testing.assert_allclose([s for s, _ in scores], ref["log_probs"], atol=1e-3, rtol=0)
  assert [n for _, n in scores] == [len(t) for t in ref["target_ids"]]

  def theirs(outputs):  # Their ids -> ours, without the EOS the search does not return.
    return [target_map[ids].tolist()[:-1] if ids and target_map[ids[-1]] == EOS_ID
            else target_map[ids].tolist() for ids in outputs]

  found = greedy.translate_nbest(ref["sources"])
  assert [hyps[0][0] for hyps in found] == ref["greedy_text"]
  sources = [source_map[ids].astype(np.int32) for ids in ref["source_ids"]]
  assert [h[0][0] for h in greedy.translate_nbest_ids(sources)] == theirs(ref["greedy"])

  beam = translator(workdir, beam_size=4, alpha=0.0, eos_within_beam=True)
  found = beam.translate_nbest_ids(sources)
  # Every line, those that end at their length limit too: generate's references score the
  # EOS there by its log-probability, as the search does (make_pretrained.eos_at_limit).
  assert [h[0][0] for h in found] == theirs(ref["beam4"])
  assert [beam.tokenizer.target.detokenize(h[0][0]) for h in found] == ref["beam4_text"]
  np.testing.assert_allclose([h[0][1] for h in found], ref["beam4_scores"], atol=1e-3, rtol=0)


@pytest.mark.devices(8)
def test_imported_parameters_shard_like_trained_ones(tmp_path):
  """Imported parameters carry the model's logical axes: placed by the training mesh's
  rules with a tensor-parallel axis (data 4 x tensor 2), and split over 8 devices as
  decode.py splits a batch, the search finds what it finds on one device."""
  from flax import linen as nn
  from configs import tiny

  from flax_transformer.training import sharding as sharding_lib
  from flax_transformer.training.steps import Trainer
  from flax_transformer.translation.programs import make_search_fn

  folder = FIXTURES / "marian_gelu_separate"
  importer.import_model(folder, tmp_path / "run")
  model_config, tokenizer = read_run(tmp_path / "run")
  params, _ = load_params(tmp_path / "run", model_config)
  ref = json.loads((folder / "references.json").read_text())
  search = SearchConfig(beam_size=4, alpha=0.0, max_extra=20, eos_within_beam=True)
  sources = [tokenizer.source.tokenize(s) for s in ref["sources"][:8]]
  inputs = np.zeros((8, max(map(len, sources))), np.int32)
  for row, ids in enumerate(sources):
    inputs[row, :len(ids)] = ids
  search_fn = jax.jit(make_search_fn(model_config, search))
  one = search_fn(jax.device_put(params, jax.devices()[0]), inputs, jax.random.PRNGKey(0))

  mesh = sharding_lib.make_mesh({"data": 4, "tensor": 2})
  trainer = Trainer(model_config, tiny.get_config(), mesh)
  placed = jax.device_put(params, trainer.state_shardings.params)
  query = placed["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
  assert "tensor" in query.sharding.spec  # Heads split over the tensor axis.
  with jax.set_mesh(mesh), nn.logical_axis_rules(trainer.rules):
    tensor_parallel = search_fn(placed, jax.device_put(inputs, trainer.batch_sharding),
                                jax.random.PRNGKey(0))
  np.testing.assert_array_equal(tensor_parallel.sequences, one.sequences)
  np.testing.assert_allclose(tensor_parallel.scores, one.scores, atol=1e-4)

  texts = ref["sources"][:8]
  alone = translator(tmp_path / "run", beam_size=4, alpha=0.0, eos_within_beam=True)
  split = Translator.from_workdir(tmp_path / "run", search=alone.search)  # All 8 devices.
  assert len(split.devices) == 8
  (got, want) = ([hyps[0] for hyps in t.translate_nbest(texts)] for t in (split, alone))
  assert [text for text, _ in got] == [text for text, _ in want]
  np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-4)


def test_every_import_pads_its_vocabularies_to_split_and_never_produces_the_padding(
    imported):
  """Marian's 511 (as OPUS-MT's 58,101) and FSMT's 404 ids split over no tensor axis of 8:
  each vocabulary is padded to a multiple of 128 rows (vocab_padding.MULTIPLE), the
  tokenizer's files cover the added ids, and the added target rows' logits are -inf (never
  produced, no probability, no gradient), as an NLLB import's."""
  folder, workdir, ref, (source_map, target_map) = imported
  model_config, tokenizer = read_run(workdir)
  real = (len(source_map), len(target_map))
  assert model_config.source_vocab % 128 == model_config.vocab_size % 128 == 0
  assert model_config.without_vocab_padding().source_vocab == real[0]
  assert model_config.vocab_size - model_config.vocab_padding == real[1]
  assert (tokenizer.source.vocab_size, tokenizer.target.vocab_size) == (
      model_config.source_vocab, model_config.vocab_size)
  params, _ = load_params(workdir, model_config)
  model = Transformer(model_config.replace(deterministic=True))
  source = source_map[ref["source_ids"][0]][None].astype(np.int32)
  target = target_map[ref["target_ids"][0]][None].astype(np.int32)

  def loss(p):
    logits = model.apply({"params": p}, source, target)
    return -jax.nn.log_softmax(logits)[0, 0, target[0, 0]], logits

  grads, logits = jax.jit(jax.grad(loss, has_aux=True))(params)  # Eager: several x the time.
  assert np.all(np.isneginf(np.asarray(logits)[..., real[1]:]))
  assert np.all(np.isfinite(np.asarray(logits)[..., :real[1]]))
  for name, tree in grads.items():
    if name.endswith("_embedding"):
      rows = real[0] if name == "source_embedding" else real[1]
      assert not np.any(np.asarray(tree["embedding"])[rows:]), name


@pytest.mark.devices(8)
def test_eight_devices_fsdp_by_tensor_equal_one_device(tmp_path):
  """OPUS-MT's odd vocabulary, padded, splits over the tensor axis: on a mesh fsdp 2 x
  tensor 4, the imported Marian model's parameters placed by the training rules
  (vocabulary, heads and d_ff over 'tensor'), its beam-4 outputs and scores equal one
  device's, and transformers'."""
  from flax import linen as nn
  from configs import tiny

  from flax_transformer.training import sharding as sharding_lib
  from flax_transformer.training.steps import Trainer
  from flax_transformer.translation.programs import make_score_fn, make_search_fn

  folder = FIXTURES / "marian_swish_shared"
  importer.import_model(folder, tmp_path / "run")
  model_config, _ = read_run(tmp_path / "run")
  params, _ = load_params(tmp_path / "run", model_config)
  source_map, target_map = id_maps(folder, tmp_path / "run")
  ref = json.loads((folder / "references.json").read_text())
  rows = range(8)
  inputs, targets = (np.zeros((8, max(len(ref[key][i]) for i in rows)), np.int32)
                     for key in ("source_ids", "target_ids"))
  for row in rows:
    inputs[row, :len(ref["source_ids"][row])] = source_map[ref["source_ids"][row]]
    targets[row, :len(ref["target_ids"][row])] = target_map[ref["target_ids"][row]]
  search = SearchConfig(beam_size=4, alpha=0.0, max_extra=20, eos_within_beam=True)
  search_fn, score_fn = jax.jit(make_search_fn(model_config, search)), jax.jit(
      make_score_fn(model_config))
  one_device = jax.device_put(params, jax.devices()[0])
  one = search_fn(one_device, inputs, jax.random.PRNGKey(0))
  one_scores = score_fn(one_device, inputs, targets)

  mesh = sharding_lib.make_mesh({"fsdp": 2, "tensor": 4})
  trainer = Trainer(model_config, tiny.get_config(), mesh)
  placed = jax.device_put(params, trainer.state_shardings.params)
  assert placed["shared_embedding"]["embedding"].sharding.spec[0] == "tensor"
  with jax.set_mesh(mesh), nn.logical_axis_rules(trainer.rules):
    batch = jax.device_put(inputs, trainer.batch_sharding)
    sharded = search_fn(placed, batch, jax.random.PRNGKey(0))
    sharded_scores = score_fn(placed, batch, jax.device_put(targets, trainer.batch_sharding))
  np.testing.assert_array_equal(sharded.sequences, one.sequences)
  np.testing.assert_allclose(sharded.scores, one.scores, atol=1e-4)
  np.testing.assert_allclose(jax.tree.leaves(sharded_scores), jax.tree.leaves(one_scores),
                             atol=1e-4)
  np.testing.assert_allclose(sharded_scores[0], ref["log_probs"][:8], atol=1e-3)
  best = np.asarray(sharded.sequences)[:, 0]
  assert ref["at_limit"][len(ref["sources"]) + 7]  # Row 7's output ends at its limit.
  for i in rows:  # transformers' beam output and score.
    assert best[i][best[i] != 0].tolist() == target_map[ref["beam4"][i]].tolist(), i
  np.testing.assert_allclose(np.asarray(sharded.scores)[:, 0], ref["beam4_scores"][:8],
                             atol=1e-3, rtol=0)


def test_bad_folders_are_one_line_naming_the_problem(tmp_path):
  from flax_transformer.errors import DataError

  def variant(name, change):
    folder = tmp_path / name
    shutil.copytree(FIXTURES / "marian_swish_shared", folder)
    change(folder)
    return folder

  def edit_config(**fields):
    def change(folder):
      config = json.loads((folder / "config.json").read_text())
      config.update(fields)
      (folder / "config.json").write_text(json.dumps(config))
    return change

  def torch_only(folder):
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")

  cases = {
      "torch": (torch_only, "save_pretrained('"),
      "bart": (edit_config(model_type="bart"), "model_type 'bart'"),
      "spm": (lambda f: (f / "target.spm").unlink(), "target.spm not found"),
      "unknown": (edit_config(rope_theta=1e4), "field 'rope_theta'"),
      "pruned": (edit_config(pruned_heads={"0": [1]}), "pruned_heads={'0': [1]}"),
      "quantized": (edit_config(quantization_config={"quant_method": "bitsandbytes"}),
                    "quantization_config={'quant_method': 'bitsandbytes'} has no equivalent "
                    "here (quantized weights: save the model unquantized"),
      "act": (edit_config(activation_function="mish"), "activation_function='mish'"),
      "size": (edit_config(vocab_size=9), "vocab_size=9"),
      "positions": (edit_config(max_position_embeddings=10**9),
                    "max_position_embeddings=1000000000 has no equivalent here (at most 65536)"),
      "tokenizer_list": (lambda f: (f / "tokenizer_config.json").write_text("[1, 2]"),
                         "tokenizer_config.json: not a JSON object of fields"),
      "bool_id": (lambda f: (f / "vocab.json").write_text(json.dumps(
          {**json.loads((f / "vocab.json").read_text()), "</s>": True})),
                  "vocab.json: not a JSON object of piece -> integer id"),
  }
  for name, (change, expected) in cases.items():
    with pytest.raises(DataError, match=re.escape(expected)):
      importer.import_model(variant(name, change), tmp_path / f"{name}_run")
    assert not (tmp_path / f"{name}_run").exists()
  # What older transformers wrote into OPUS-MT's config.json (transformers 4.9's
  # Helsinki-NLP/opus-mt-en-de): fields that leave the function as it is.
  importer.import_model(variant("old", edit_config(
      _num_labels=3, add_bias_logits=False, add_final_layer_norm=False, bad_words_ids=[[510]],
      bos_token_id=0, classif_dropout=0.0, classifier_dropout=0.0, gradient_checkpointing=False,
      id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}, max_length=512, num_beams=4,
      normalize_before=False, normalize_embedding=False, num_hidden_layers=2,
      static_position_embeddings=True, torch_dtype="float32", problem_type=None,
      tokenizer_class=None, prefix=None, task_specific_params=None, sep_token_id=None,
      _name_or_path="Helsinki-NLP/opus-mt-en-de", transformers_version="4.9.0.dev0")),
      tmp_path / "old_run")
  importer.import_model(FIXTURES / "marian_swish_shared", tmp_path / "plain_run")
  assert read_run(tmp_path / "old_run")[0] == read_run(tmp_path / "plain_run")[0]
  # MarianMTModel reads none of BART's legacy fields (transformers 4.57 and 5.24): any value
  # loads there and computes post-norm Marian, so here too, and the run record says so.
  importer.import_model(variant("ignored", edit_config(normalize_before=True,
                                                       add_bias_logits=True)),
                        tmp_path / "ignored_run")
  assert read_run(tmp_path / "ignored_run")[0] == read_run(tmp_path / "plain_run")[0]
  notes = json.loads((tmp_path / "ignored_run" / "run.json").read_text())["imported_from"]["notes"]
  assert "normalize_before=True: MarianMTModel ignores it and computes False, as here" in notes
  # The command: one line on stderr, exit 2, no traceback.
  done = subprocess.run([sys.executable, str(ROOT / "import_model.py"),
                         f"--from={tmp_path / 'pruned'}", f"--workdir={tmp_path / 'w'}"],
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stderr
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  assert lines == [f"error: {tmp_path / 'pruned' / 'config.json'}: pruned_heads={{'0': [1]}} "
                   "has no equivalent here (only {})"], done.stderr


def test_a_shared_embedding_under_any_of_its_tied_names_imports_the_same(tmp_path):
  """Generic safetensors converters keep one of the four tied names, whichever they like
  (transformers loads each with the same logits); a tied copy that differs is refused."""
  from safetensors.numpy import load_file, save_file

  from flax_transformer.errors import DataError
  from flax_transformer.pretrained import marian

  original = FIXTURES / "marian_swish_shared"
  weights = load_file(original / "model.safetensors")
  embedding = weights.pop("model.shared.weight")
  folder = tmp_path / "lm_head_only"
  shutil.copytree(original, folder)
  save_file({**weights, "lm_head.weight": embedding}, folder / "model.safetensors")
  jax.tree.map(np.testing.assert_array_equal, marian.import_folder(folder).params,
               marian.import_folder(original).params)
  save_file({**weights, "lm_head.weight": embedding,
             "model.decoder.embed_tokens.weight": embedding + 1}, folder / "model.safetensors")
  with pytest.raises(DataError, match=re.escape("lm_head.weight differs from "
                                                "model.decoder.embed_tokens.weight")):
    marian.import_folder(folder)


def test_exports_of_an_imported_model_translate_as_it_does(tmp_path):
  """export.py's StableHLO and CTranslate2 folders carry an imported model's tokenizer
  (separate vocabularies here) and translate as the Translator does (greedy)."""
  from flax_transformer.export import ct2
  from flax_transformer.export.runner import open_model
  from flax_transformer.export.stablehlo import export_stablehlo

  folder = FIXTURES / "marian_gelu_separate"
  importer.import_model(folder, tmp_path / "run")
  model_config, tokenizer = read_run(tmp_path / "run")
  params, _ = load_params(tmp_path / "run", model_config)
  model_config = model_config.replace(max_len=32)  # Two batch widths to export, not eight.
  texts = json.loads((folder / "references.json").read_text())["sources"][:6]
  search = SearchConfig(beam_size=1, max_extra=8)
  ours = Translator(model_config, params, tokenizer, search, devices=jax.devices()[:1])
  want = ours.translate(texts)
  assert all(want)
  export_stablehlo(ours, tmp_path / "stablehlo", batch_tokens=128)
  assert open_model(tmp_path / "stablehlo").translate(texts) == want
  ct2.convert(model_config, params, tokenizer, tmp_path / "ct2",
              search={"beam_size": 1, "alpha": 0.6, "max_extra": 8})
  assert open_model(tmp_path / "ct2").translate(texts) == want
  # The import padded the vocabularies (512 and 384 rows); CTranslate2's are the folder's.
  assert (model_config.source_vocab, model_config.vocab_size) == (512, 384)
  assert [len(json.loads((tmp_path / "ct2" / f"{side}_vocabulary.json").read_text()))
          for side in ("source", "target")] == [400, 300]


def test_decode_py_scores_and_averaging_copies_an_imported_workdir(tmp_path):
  """decode.py --score on an imported workdir gives transformers' summed log-probabilities;
  average_checkpoints' output keeps its tokenizer."""
  from flax_transformer.averaging import write_averaged

  folder = FIXTURES / "marian_gelu_separate"
  importer.import_model(folder, tmp_path / "run")
  write_averaged(tmp_path / "run", tmp_path / "avg", 1)
  ref = json.loads((folder / "references.json").read_text())
  (tmp_path / "src").write_text("\n".join(ref["sources"][:8]) + "\n")
  (tmp_path / "ref").write_text("\n".join(ref["targets"][:8]) + "\n")
  done = subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={tmp_path / 'avg'}",
                         f"--input={tmp_path / 'src'}", f"--score={tmp_path / 'ref'}",
                         "--average_last=1", "--cpu_devices=1", "--compilation_cache_dir="],
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  scores = [line.split("\t") for line in done.stdout.splitlines()]
  np.testing.assert_allclose([float(s) for s, _ in scores], ref["log_probs"][:8], atol=1e-3)
  assert [int(n) for _, n in scores] == [len(t) for t in ref["target_ids"][:8]]


def test_an_ensemble_of_imports_padded_differently_says_so(tmp_path, monkeypatch):
  """A workdir imported before imports padded their vocabularies (OPUS-MT's 58,101 rows, the
  fixture's 511) and one imported after (58,112; 512) hold the same pieces: an ensemble of
  the two is refused in one line that names the padding, not as another vocabulary."""
  from flax_transformer.errors import DataError
  from flax_transformer.pretrained import vocab_padding

  fixture = FIXTURES / "marian_swish_shared"
  importer.import_model(fixture, tmp_path / "new")
  monkeypatch.setattr(vocab_padding, "MULTIPLE", 1)  # An import before the padding.
  importer.import_model(fixture, tmp_path / "old")
  assert read_run(tmp_path / "old")[0].vocab_size == 511
  for first, other in (("new", "old"), ("old", "new")):
    with pytest.raises(DataError, match=r"the same 511 ids, padded differently"):
      Translator.from_workdir(tmp_path / first, ensemble=[tmp_path / other])


X64_DECODE = """
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
from flax_transformer import workdir as workdir_lib
from flax_transformer.pretrained import importer
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator
folder, workdir = sys.argv[1:3]
importer.import_model(folder, workdir)
search = SearchConfig(beam_size=4, alpha=0.0, max_extra=20, eos_within_beam=True)
t32 = Translator.from_workdir(workdir, search=search)
config, params = t32.member()
t64 = Translator(config.replace(dtype="float64", param_dtype="float64"),
                 jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), params),
                 t32.tokenizer, search, languages=workdir_lib.languages(workdir))
sources = json.loads(open(folder + "/references.json").read())["sources"]
print(json.dumps({name: t.translate_nbest(sources) for name, t in (("float32", t32),
                                                                  ("float64", t64))}))
"""


def test_beam_search_under_jax_enable_x64_is_transformers(tmp_path):
  """A JAX program with jax_enable_x64 on (a user's project, or a float64 check of a
  float32 difference) searches as float32 does: a float32 model, and the model cast to
  float64, give transformers' beam-4 outputs and scores."""
  folder = FIXTURES / "marian_swish_shared"
  ref = json.loads((folder / "references.json").read_text())
  done = subprocess.run([sys.executable, "-c", X64_DECODE, str(folder), str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-2000:]
  for name, found in json.loads(done.stdout.splitlines()[-1]).items():  # Every line.
    assert [h[0][0] for h in found] == ref["beam4_text"], name
    np.testing.assert_allclose([h[0][1] for h in found], ref["beam4_scores"], atol=1e-3,
                               rtol=0, err_msg=name)
