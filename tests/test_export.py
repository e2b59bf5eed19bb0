"""export.py: the StableHLO runner against decode.py, CTranslate2 against our model."""

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import cpu_env
from flax_transformer import Transformer, TransformerConfig
from flax_transformer.errors import ConfigError
from flax_transformer.export import ct2, folder_files, runner
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
MAX_EXTRA = 5  # Short outputs keep the tiny model's 1000 test sentences quick.
# Runs the exported runner with these packages unimportable: it must not need them.
BLOCKED_RUN = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in ('flax_transformer', 'flax', 'orbax'):
      raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name='__main__')
print('loaded:', sorted({m.split('.')[0] for m in sys.modules} & {'flax_transformer', 'flax',
      'orbax', 'optax', 'grain'}), file=sys.stderr)
"""


def lines(multi30k_dir, name, count=None):
  with gzip.open(Path(multi30k_dir) / name, "rt", encoding="utf-8") as f:
    out = [line.rstrip("\n") for line in f]
  return out[:count] if count else out


def run(*args):
  # No device count in XLA_FLAGS: decode.py and the runner take one CPU device per core,
  # as users get.
  return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                        env=cpu_env(), cwd=ROOT)


def export_and_translate(workdir, sources, folder, *flags) -> list[str]:
  """export.py into `folder`, then its translate.py over `sources` with flax_transformer,
  flax and orbax unimportable: the output lines."""
  done = run(ROOT / "export.py", f"--workdir={workdir}", f"--out={folder}", *flags)
  assert done.returncode == 0, done.stderr[-3000:]
  output = folder.parent / f"{folder.name}.out"
  translated = run("-c", BLOCKED_RUN, folder / "translate.py", f"--input={sources}",
                   f"--output={output}")
  assert translated.returncode == 0, translated.stderr[-3000:]
  assert "loaded: []" in translated.stderr
  return output.read_text().splitlines()


@pytest.fixture(scope="module")
def workdir(trained_tiny):
  """The session's trained tiny run (conftest.trained_tiny, 60 steps): read, never written."""
  return trained_tiny


@pytest.fixture(scope="module")
def test_2016(workdir, multi30k_dir, tmp_path_factory):
  """decode.py's beam search (beam 4, alpha 0.6) of test 2016: (sources file, output lines)."""
  folder = tmp_path_factory.mktemp("test2016")
  sources = folder / "test.en"
  sources.write_text("\n".join(lines(multi30k_dir, "test_2016_flickr.en.gz")) + "\n")
  done = run(ROOT / "decode.py", f"--workdir={workdir}", f"--input={sources}",
             f"--output={folder / 'decode.de'}", f"--max_extra={MAX_EXTRA}",
             "--compilation_cache_dir=")
  assert done.returncode == 0, done.stderr[-3000:]
  return sources, (folder / "decode.de").read_text().splitlines()


def test_stablehlo_runner_equals_decode_py_on_test_2016_without_our_packages(
    workdir, test_2016, tmp_path):
  sources, decoded = test_2016
  (tmp_path / "export").mkdir()
  (tmp_path / "export" / "manifest.json").write_text(json.dumps(
      {"format": runner.FORMAT, "files": ["manifest.json", "search_1x16.stablehlo"]}))
  (tmp_path / "export" / "search_1x16.stablehlo").write_text("an older export's")
  exported = export_and_translate(workdir, sources, tmp_path / "export",
                                  f"--max_extra={MAX_EXTRA}", "--overwrite")
  # Replaced whole, not written over: none of the older export's files stays.
  assert not (tmp_path / "export" / "search_1x16.stablehlo").exists()
  # Its manifest lists what it wrote (translate.py's run added nothing to the folder).
  assert manifest_files(tmp_path / "export") == folder_files(tmp_path / "export")
  assert len(exported) == len(decoded) == 1000
  assert exported == decoded
  assert len(set(decoded)) > 20  # A model that tells sentences apart, so equality means much.


def test_ctranslate2_greedy_equals_ours_on_100_validation_sentences(workdir, multi30k_dir,
                                                                     tmp_path):
  """The tiny model's greedy outputs mostly run to their length limit, so this holds
  CTranslate2 to our search's limits; the weights are held by the scores test below,
  and the README job's model by bench/export.py (retired since; results/bench/export.json)."""
  sentences = lines(multi30k_dir, "val.en.gz", 100)
  ours = Translator.from_workdir(workdir, search=SearchConfig(beam_size=1),
                                 devices=jax.devices()[:1])  # One compile, not eight.
  out = tmp_path / "ct2"
  config, params = ours.member(0)
  ct2.convert(config, params, ours.tokenizer, out)
  theirs = runner.Ct2Runner(out).translate(sentences, beam_size=1)
  expected = ours.translate(sentences)
  assert theirs == expected


def test_ctranslate2_beam_bleu_within_0_3_of_decode_py(workdir, test_2016, multi30k_dir,
                                                        tmp_path):
  sources, decoded = test_2016
  theirs = export_and_translate(workdir, sources, tmp_path / "ct2", "--format=ctranslate2",
                                f"--max_extra={MAX_EXTRA}")  # Beam 4, alpha 0.6: defaults.
  assert manifest_files(tmp_path / "ct2") == folder_files(tmp_path / "ct2")
  references = [lines(multi30k_dir, "test_2016_flickr.de.gz")]
  ours_bleu = sacrebleu.corpus_bleu(decoded, references).score
  their_bleu = sacrebleu.corpus_bleu(theirs, references).score
  # Same model and penalty; only where the two beams prune differs (docs/decoding.md, export.py).
  assert abs(ours_bleu - their_bleu) <= 0.3, (ours_bleu, their_bleu)


@pytest.mark.parametrize("variant", [
    {}, {"norm": "pre"}, {"positional": "learned"}, {"attention_bias": True},
    {"share_embeddings": False}, {"start_from_zero_embedding": True}])
def test_ctranslate2_scores_every_target_token_as_our_model(variant, multi30k_tokenizer,
                                                            multi30k_dir, tmp_path):
  """Teacher-forced log-probabilities of 16 validation pairs under random weights:
  every parameter's place in the converted model shows in them."""
  tokenizer = multi30k_tokenizer
  config = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4,
                             num_layers=2, max_len=64, deterministic=True, **variant)
  sources = [tokenizer.tokenize(s) for s in lines(multi30k_dir, "val.en.gz", 16)]
  targets = [tokenizer.tokenize(s) for s in lines(multi30k_dir, "val.de.gz", 16)]
  width = max(map(len, sources + targets))
  pad = lambda rows: jnp.asarray([np.pad(r, (0, width - len(r))) for r in rows])
  model = Transformer(config)
  # Op by op, not jitted: the variants share most operations, compiled once each here,
  # where five whole-model compiles took about three times the CPU time (on 2 cores).
  params = model.init(jax.random.PRNGKey(1), pad(sources), pad(targets))["params"]
  params = jax.tree_util.tree_map(lambda x: x + 0.1 * jax.random.normal(
      jax.random.PRNGKey(2), x.shape), params)  # Biases and norms away from 0 and 1, too.
  logits = model.apply({"params": params}, pad(sources), pad(targets))
  log_probs = jax.nn.log_softmax(logits)
  ours = [np.take_along_axis(np.asarray(log_probs[i, :len(t)]), t[:, None], 1)[:, 0]
          for i, t in enumerate(targets)]
  ct2.convert(config, params, tokenizer, tmp_path)
  import ctranslate2

  scorer = ctranslate2.Translator(str(tmp_path), device="cpu")
  # CTranslate2 scores the target plus its own EOS: our targets end in EOS already.
  scored = scorer.score_batch([tokenizer.pieces(s) for s in sources],
                              [tokenizer.pieces(t[:-1]) for t in targets])
  for mine, theirs in zip(ours, scored):
    np.testing.assert_allclose(theirs.log_probs, mine, atol=2e-4, rtol=1e-4)


def test_missing_ctranslate2_names_the_extra(monkeypatch, multi30k_tokenizer):
  real = ct2.importlib.util.find_spec
  monkeypatch.setattr(ct2.importlib.util, "find_spec",
                      lambda name, *a: None if name == "ctranslate2" else real(name, *a))
  with pytest.raises(ConfigError, match=r"\.\[ctranslate2\]"):
    ct2.build_spec(TransformerConfig(vocab_size=10), {}, multi30k_tokenizer)


# --- Where export.py writes: never over the run, whole or not at all ------------------

def manifest_files(folder) -> list[str]:
  return json.loads((Path(folder) / "manifest.json").read_text())["files"]


def workdir_files(path) -> dict:
  return {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*"))
          if p.is_file()}


def test_out_that_is_holds_or_lies_in_the_run_or_a_bucket_is_refused(tmp_path):
  """Refused before anything is loaded or touched (a stand-in workdir: nothing of it
  is read), in one line with exit status 2: the issue's two cases through export.py,
  the others through its check."""
  run_dir = tmp_path / "runs" / "w"
  for name, data in (("run.json", "{}"), ("vocab.model", "v"), ("checkpoints/30/state", "s")):
    (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / name).write_text(data)
  before = workdir_files(run_dir)
  cases = {  # --out -> what the line says
      str(run_dir): "is or holds the workdir",
      "gs://bucket/export": "is a bucket: export.py writes a local folder"}
  jobs = {out: subprocess.Popen(  # At once: each is mostly imports.
      [sys.executable, str(ROOT / "export.py"), f"--workdir={run_dir}", f"--out={out}",
       "--overwrite"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      cwd=tmp_path, env=cpu_env()) for out in cases}
  for out, job in jobs.items():
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == 2, (out, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --out {out} "), (out, stderr)
    assert cases[out] in lines[0], (out, stderr)
  assert workdir_files(run_dir) == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # No local "gs:" folder.
  from flax_transformer.cli.export import check_out

  for out, message in ((tmp_path / "runs", "is or holds the workdir"),
                       (run_dir / "x" / "..", "is or holds the workdir"),
                       (run_dir / "checkpoints", "the workdir's own"),
                       (run_dir / "checkpoints" / "30", "the workdir's own"),
                       (run_dir / "vocab.model", "the workdir's own")):
    with pytest.raises(ConfigError, match=message):
      check_out(str(out), str(run_dir), overwrite=True)
  (tmp_path / "runs" / "export").mkdir()
  (tmp_path / "runs" / "export" / "manifest.json").write_text(
      json.dumps({"format": runner.FORMAT, "files": ["manifest.json"]}))
  with pytest.raises(ConfigError, match="exists and is not empty; .* pass --overwrite"):
    check_out(str(tmp_path / "runs" / "export"), str(run_dir), overwrite=False)
  # --overwrite replaces an earlier export only: not another run, not any other folder.
  other_run = tmp_path / "runs" / "other"
  (other_run / "checkpoints").mkdir(parents=True)
  (other_run / "run.json").write_text("{}")
  (other_run / "manifest.json").write_text(json.dumps({"format": runner.FORMAT}))
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "todo.txt").write_text("mine")
  for out in (other_run, notes):
    with pytest.raises(ConfigError, match="is not an earlier export"):
      check_out(str(out), str(run_dir), overwrite=True)
  # Beside the run's own entries, or beside the run: fine.
  assert check_out(str(run_dir / "export"), str(run_dir), overwrite=False) == run_dir / "export"
  assert check_out(str(tmp_path / "runs" / "export"), str(run_dir), overwrite=True) == (
      tmp_path / "runs" / "export")


def test_a_failed_export_leaves_the_previous_one_whole(workdir, tmp_path):
  import resource

  out = tmp_path / "export"
  out.mkdir()
  previous = json.dumps({"format": runner.FORMAT, "note": "the previous export",
                         "files": ["manifest.json"]})
  (out / "manifest.json").write_text(previous)
  limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))  # noqa: E731
  # Files may not grow past 64 kB (EFBIG, as a full disk gives ENOSPC): the first module fails.
  failed = subprocess.run([sys.executable, str(ROOT / "export.py"), f"--workdir={workdir}",
                           f"--out={out}", "--overwrite"], capture_output=True, text=True,
                          env=cpu_env(), cwd=ROOT, preexec_fn=limit)
  assert failed.returncode == 1, failed.stderr[-3000:]
  assert "Traceback" not in failed.stderr
  assert failed.stderr.strip().splitlines()[-1].startswith(
      f"error: writing the export to {out} failed (File too large)")
  assert workdir_files(out) == {"manifest.json": previous.encode()}
  assert [p.name for p in tmp_path.iterdir()] == ["export"]  # No partial folder beside it.


def test_overwrite_refuses_an_export_holding_files_its_manifest_does_not_list(
    bf16_export, tmp_path):
  """A user's notes or converted model added to an earlier export would go with it:
  refused in one line naming them, as is an export whose manifest lists no files."""
  from flax_transformer.cli.export import check_out

  _, folder = bf16_export
  out = Path(shutil.copytree(folder, tmp_path / "export"))
  assert manifest_files(out) == folder_files(out)  # All the export wrote, itself included.
  (tmp_path / "run").mkdir()
  assert check_out(str(out), str(tmp_path / "run"), overwrite=True) == out
  (out / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError, match=r"^--out \S+ holds files the export did not write "
                     r"\(notes\.txt\): --overwrite would delete them; move them out"):
    check_out(str(out), str(tmp_path / "run"), overwrite=True)
  for name in ("converted/model.bin", "converted/vocab.txt", "a.txt", "b.txt"):
    (out / name).parent.mkdir(exist_ok=True)
    (out / name).write_text("mine")
  with pytest.raises(ConfigError, match=r"\(a\.txt, b\.txt, converted/model\.bin and 2 "
                     r"more\)"):
    check_out(str(out), str(tmp_path / "run"), overwrite=True)
  for name in ("notes.txt", "a.txt", "b.txt"):
    (out / name).unlink()
  shutil.rmtree(out / "converted")
  manifest = json.loads((out / "manifest.json").read_text())
  del manifest["files"]  # As every export before the list.
  (out / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ConfigError, match=r"is an export from before export.py listed its "
                     r"files .* delete the folder, then export again"):
    check_out(str(out), str(tmp_path / "run"), overwrite=True)


# --- The runner in-process: bfloat16 parameters, the platform it runs on ---------------

def short_sentences(translator, multi30k_dir, count):
  """The first `count` validation sentences of at most 16 tokens: one batch width, so
  each search (the runner's, the Translator's) compiles once for every test here."""
  pool = [s for s in lines(multi30k_dir, "val.en.gz", 300)
          if len(translator.tokenizer.tokenize(s)) <= 16]
  assert len(pool) >= count
  return pool[:count]


def exported(workdir, folder, search, cast=None):
  """(Translator on one device, its StableHLO export in `folder`): the export's shapes
  are that Translator's, so the two search the same batches."""
  from flax_transformer.export.stablehlo import export_stablehlo

  loaded = Translator.from_workdir(workdir, devices=jax.devices()[:1])
  config, params = loaded.member(0)
  if cast is not None:
    params = jax.tree_util.tree_map(lambda x: x.astype(cast), params)
  translator = Translator(config, params, loaded.tokenizer, search, devices=jax.devices()[:1])
  export_stablehlo(translator, folder, batch_tokens=translator.batch_tokens)
  return translator, folder


@pytest.fixture(scope="module")
def bf16_export(workdir, tmp_path_factory):
  """The trained model's parameters in bfloat16, greedy search, exported for the CPU."""
  return exported(workdir, tmp_path_factory.mktemp("bf16"), SearchConfig(beam_size=1,
                  max_extra=MAX_EXTRA), cast=jnp.bfloat16)


def test_bfloat16_parameters_come_back_as_bfloat16(bf16_export, multi30k_dir):
  translator, folder = bf16_export
  model = runner.Runner(folder)
  assert {str(x.dtype) for x in model._params[0]} == {"bfloat16"}
  sentences = short_sentences(translator, multi30k_dir, 8)
  assert model.translate(sentences) == translator.translate(sentences)


def test_a_cpu_export_runs_on_the_cpu_where_jax_defaults_to_cuda(bf16_export, multi30k_dir,
                                                                   monkeypatch):
  """A CUDA host, simulated (none here): jax's default backend is the GPU, whose devices
  a CPU export cannot run on; the runner must take the CPU's."""
  translator, folder = bf16_export
  real = jax.local_devices

  def local_devices(process_index=None, backend=None):
    if backend in (None, "gpu", "cuda"):
      raise AssertionError("the simulated host's CUDA devices, for a CPU export")
    return real(process_index, backend)

  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(jax, "local_devices", local_devices)
  model = runner.Runner(folder)
  assert {d.platform for d in model.devices} == {"cpu"}
  sentences = short_sentences(translator, multi30k_dir, 8)
  assert model.translate(sentences) == translator.translate(sentences)


def test_an_export_for_a_platform_jax_lacks_is_one_line(bf16_export, tmp_path):
  import json
  import shutil

  _, folder = bf16_export
  copy = Path(shutil.copytree(folder, tmp_path / "tpu"))
  manifest = json.loads((copy / "manifest.json").read_text())
  (copy / "manifest.json").write_text(json.dumps({**manifest, "platforms": ["tpu"]}))
  with pytest.raises(SystemExit, match=r"^error: the model was exported for tpu, which this "
                     r"jax cannot run \(its default backend: cpu\); export it again with "
                     r"--platforms=cpu$"):
    runner.Runner(copy)


@pytest.fixture(scope="module")
def beam_export(workdir, tmp_path_factory):
  """Beam 3 and a length penalty of 1.0 (not decode.py's defaults), float32, exported."""
  return exported(workdir, tmp_path_factory.mktemp("beam3"),
                  SearchConfig(beam_size=3, alpha=1.0, max_extra=MAX_EXTRA))


@settings(max_examples=6, deadline=None)
@given(picks=st.lists(st.integers(0, 39), min_size=1, max_size=6),
       blanks=st.lists(st.sampled_from(["", "   "]), max_size=2), choices=st.data())
def test_exported_translations_equal_the_translators(beam_export, multi30k_dir, picks, blanks,
                                                     choices):
  """Any handful of sentences (blank lines, repeats, any order): the export's
  translations are the Translator's, with the same model and search settings."""
  translator, folder = beam_export
  pool = short_sentences(translator, multi30k_dir, 40)
  sentences = choices.draw(st.permutations([pool[i] for i in picks] + blanks), label="order")
  assert runner_for(folder).translate(sentences) == translator.translate(sentences)


_RUNNERS: dict = {}


def runner_for(folder) -> runner.Runner:
  """One Runner per export for the whole module: its compiled shapes carry over."""
  if folder not in _RUNNERS:
    _RUNNERS[folder] = runner.Runner(folder)
  return _RUNNERS[folder]


def test_an_export_is_not_refused_for_this_hosts_memory(tmp_path, monkeypatch):
  """A StableHLO export is lowered here and run on a --platforms machine: it is checked
  against what one of that machine's devices may hold (search_memory.export_bound), not
  this host's free memory (here made 8 MiB), with which decode.py still refuses it.
  Before: `export.py --beam_size=256 --platforms=cuda` on an imported tiny Marian model
  was refused ("needs at least 9.4 GiB, over the 8.7 GiB of the host's available memory
  per device") on a CPU host. A search no device holds: test_decoding's TOO_LARGE."""
  from flax_transformer.export.stablehlo import export_stablehlo
  from flax_transformer.pretrained import importer
  from flax_transformer.translation import search_memory

  workdir = tmp_path / "imported"
  importer.import_model(Path(__file__).parent / "fixtures" / "marian_swish_shared", workdir)
  monkeypatch.setattr(search_memory, "available_bytes", lambda device=None: (8 << 20, "test"))
  translator = Translator.from_workdir(workdir, search=SearchConfig(beam_size=256, max_extra=4))
  manifest = export_stablehlo(translator, tmp_path / "out", batch_tokens=256)
  assert manifest["search"]["beam_size"] == 256 and len(manifest["shapes"]) == 8
  with pytest.raises(ConfigError, match=r"^beam_size=256: a search of .* needs at least "):
    translator.translate(["A man in an orange hat."])
