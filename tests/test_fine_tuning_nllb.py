"""Fine-tuning an imported NLLB (issue 77): train.py --config.init_from=<the tiny NLLB
fixture's workdir> with config.languages naming its languages (NLLB's codes or ISO 639),
EN->DE and EN->FR among them, in one run; the data marked with the model's own language
codes (data.multilingual.of_model); decode.py, serve.py and the Translator agree on the
result."""

import json
import re
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

import conftest
from conftest import ROOT, cpu_env, train_command
from flax_transformer.data.pipeline import TokenizePair
from flax_transformer.data.sources import load_pairs
from flax_transformer.errors import ConfigError
from flax_transformer.pretrained import importer
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator
from flax_transformer.workdir import Workdir, languages, read_run

sys.path.insert(0, str(ROOT))
from configs import tiny  # noqa: E402

SENTENCES = ["A dog runs in the park.", "Two men are playing football.", "A woman reads."]
CODES = {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn"}
LANGUAGES = "en,deu_Latn,fra_Latn"  # Both forms: ISO 639 and NLLB's.
SEARCH = ["--average_last=1", "--max_extra=5", "--beam_size=2"]


@pytest.fixture(scope="module")
def fine_tuned_nllb(multi30k_dir, tmp_path_factory):
  """(imported workdir, fine-tuned workdir): the tiny NLLB fixture imported, then 40 steps
  on Multi30k between EN, DE and FR (six directions, EN->DE and EN->FR among them), an
  evaluation every 10. A pretrained model's rate: a tenth of the tiny run's peak (at 0.3
  the loss rose)."""
  folder = tmp_path_factory.mktemp("nllb")
  imported, workdir = folder / "imported", folder / "fine_tuned"
  importer.import_model(ROOT / "tests/fixtures/nllb", imported)
  done = subprocess.run(train_command(
      workdir, multi30k_dir, f"--config.init_from={imported}", f"--config.languages={LANGUAGES}",
      "--config.batch_tokens=512", "--config.max_source_length=32",
      "--config.max_target_length=32", "--config.num_eval_steps=2",
      "--config.learning_rate=0.05", "--config.warmup_steps=10", "--config.log_every_steps=10",
      "--config.num_train_steps=40", "--config.eval_every_steps=10"),
      env=cpu_env(), capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  return imported, workdir


def data_config(multi30k_dir, codes=LANGUAGES):
  config = tiny.get_config()
  config.unlock()
  config.manual_dir, config.languages = multi30k_dir, codes
  return config


def test_the_data_is_marked_with_the_models_own_language_codes(fine_tuned_nllb, multi30k_dir):
  """Each source starts with its language's NLLB code (the tokenizer places it first) and
  each target with its target's code, which the decoder produces first: NLLB's own scheme,
  not the '<2xx>' tokens of a multilingual model trained here."""
  imported, _ = fine_tuned_nllb
  config = data_config(multi30k_dir)
  model = languages(imported)
  pairs = load_pairs(config, config.train_split, model_languages=model)
  names = [d["direction"] for d in pairs.identity["directions"]]
  assert {"eng_Latn-deu_Latn", "eng_Latn-fra_Latn"} <= set(names) and len(names) == 6
  _, tokenizer = read_run(imported)
  ids = {code: tokenizer.target.piece_id(code) for code in CODES.values()}
  seen = set()
  for i in range(0, len(pairs), 997):
    source, target = pairs[i]
    source_code, target_code = source.split()[0], target.split()[0]
    example = TokenizePair(tokenizer)(pairs[i])
    assert example["inputs"][0] == ids[source_code] and example["targets"][0] == ids[target_code]
    seen.add((source_code, target_code))
  assert ("eng_Latn", "deu_Latn") in seen and ("eng_Latn", "fra_Latn") in seen
  with pytest.raises(ConfigError, match="'es' is not one of the init_from model's languages"):
    load_pairs(data_config(multi30k_dir, "en,es"), config.train_split, model_languages=model)


def test_the_loss_falls_and_the_record_keeps_the_models_languages(fine_tuned_nllb):
  imported, workdir = fine_tuned_nllb
  record = json.loads(Workdir(workdir).run_file.read_text())
  source = json.loads(Workdir(imported).run_file.read_text())
  assert record["languages"] == source["languages"]
  assert record["model"]["vocab_padding"] == source["model"]["vocab_padding"] > 0
  metrics = {m["step"]: m for m in map(json.loads, Workdir(workdir).metrics_file.read_text()
                                        .splitlines())}
  assert np.isfinite(metrics[10]["loss"]) and np.isfinite(metrics[10]["eval_loss"])
  # Measured: training loss 4.20 -> 4.04, evaluation loss 3.152 -> 3.083 (steps 10 -> 40).
  assert metrics[40]["eval_loss"] < metrics[10]["eval_loss"] - 0.03, metrics
  assert metrics[40]["loss"] < metrics[10]["loss"], metrics


def test_decode_serve_and_the_translator_agree_into_german_and_french(fine_tuned_nllb,
                                                                      tmp_path):
  _, workdir = fine_tuned_nllb
  common = [*SEARCH, f"--compilation_cache_dir={conftest.XLA_CACHE}"]
  translator = Translator.from_workdir(workdir, search=SearchConfig(beam_size=2, max_extra=5))
  decoded, ours = {}, {}
  for target in ("de", "fr"):
    done = subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}",
                           "--source_lang=eng_Latn", f"--target_lang={target}", *common],
                          input="\n".join(SENTENCES) + "\n", env=cpu_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    decoded[target] = done.stdout.splitlines()
    ours[target] = translator.translate(SENTENCES, source_lang="en", target_lang=target)
  assert decoded["de"] != decoded["fr"]
  log = tmp_path / "serve.log"
  with open(log, "wb") as out:
    server = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), f"--workdir={workdir}",
                               "--port=0", "--max_tokens=16", "--max_batch=4", *common],
                              stdout=out, stderr=subprocess.STDOUT, env=cpu_env())
  served = {}
  try:
    deadline = time.time() + 240
    while not (serving := re.search(r"Serving \S+ on (http://127\.0\.0\.1:\d+)/",
                                    log.read_text())):
      assert server.poll() is None and time.time() < deadline, log.read_text()[-3000:]
      time.sleep(0.3)
    for target in ("de", "fr"):
      body = {"text": SENTENCES, "source_lang": "en", "target_lang": CODES[target]}
      request = urllib.request.Request(serving[1] + "/translate", data=json.dumps(body).encode())
      with urllib.request.urlopen(request, timeout=120) as response:
        served[target] = json.loads(response.read())["translations"]
  finally:
    server.terminate()
    server.wait(timeout=60)
  assert decoded == ours == served
