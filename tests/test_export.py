"""export.py: the StableHLO runner against decode.py, CTranslate2 against our model."""

import gzip
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

from flax_transformer import Transformer, TransformerConfig
from flax_transformer.errors import ConfigError
from flax_transformer.export import ct2, runner
from flax_transformer.translation.translator import SearchConfig, Translator

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


def run(*args, env_flags=""):
  # XLA_FLAGS cleared: decode.py and the runner take one CPU device per core, as users get.
  return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                        env=dict(os.environ, XLA_FLAGS=env_flags), cwd=ROOT)


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
def workdir(tmp_path_factory, multi30k_dir):
  path = tmp_path_factory.mktemp("export") / "run"
  done = run(ROOT / "train.py", "--config", ROOT / "configs/tiny.py", f"--workdir={path}",
             f"--config.manual_dir={multi30k_dir}", "--config.bleu_every_steps=0",
             "--config.num_train_steps=60", "--config.checkpoint_every_steps=30")
  assert done.returncode == 0, done.stderr[-3000:]
  return path


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
  exported = export_and_translate(workdir, sources, tmp_path / "export",
                                  f"--max_extra={MAX_EXTRA}")
  assert len(exported) == len(decoded) == 1000
  assert exported == decoded
  assert len(set(decoded)) > 20  # A model that tells sentences apart, so equality means much.


def test_ctranslate2_greedy_equals_ours_on_100_validation_sentences(workdir, multi30k_dir,
                                                                     tmp_path):
  """The tiny model's greedy outputs mostly run to their length limit, so this holds
  CTranslate2 to our search's limits; the weights are held by the scores test below,
  and the README job's model by bench/export.py."""
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
  references = [lines(multi30k_dir, "test_2016_flickr.de.gz")]
  ours_bleu = sacrebleu.corpus_bleu(decoded, references).score
  their_bleu = sacrebleu.corpus_bleu(theirs, references).score
  # Same model and penalty; only where the two beams prune differs (README, export.py).
  assert abs(ours_bleu - their_bleu) <= 0.3, (ours_bleu, their_bleu)


@pytest.mark.parametrize("variant", [
    {}, {"norm": "pre"}, {"positional": "learned"}, {"attention_bias": True},
    {"share_embeddings": False}])
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
