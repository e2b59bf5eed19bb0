"""Every ```bash and ```python block of README.md and docs/*.md runs as written, as a
newcomer would run it: from a fresh folder laid out as a fresh clone elsewhere (the
checkout's files, no ../shared beside it), against the session's tiny trained workdir
(conftest.trained_tiny) and a short slice of Multi30k.

What stands for what is the table below (PLACEHOLDERS, TRAIN_OVERRIDES, SERVE_FLAGS):
the docs' DIR is the tiny workdir, train.py runs a few steps of a tiny model, and so on.
A block that cannot run here says why in a `<!-- not run: WHY -->` line just above its
fence; NOT_RUN lists every such marker, so none is added or kept unseen. Bash blocks run
with `bash -e -o pipefail`, curl failing on an HTTP error; the Python blocks run one
after another in one process (one jax start), each from its own fresh folder."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conftest
from conftest import ROOT, cpu_env

DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]

# A fenced block, indented as a list item's may be, and the line above it.
BLOCK = re.compile(r"(?:^(?P<above>[^\n]*)\n)?^(?P<indent> *)```(?P<lang>bash|python)\n"
                   r"(?P<body>.*?)^(?P=indent)```", re.S | re.M)
MARKER = re.compile(r"<!-- not run: (.+?) -->")

# A block of a script's flags, [optional] and ALTERNATIVE|S: test_every_flag_of_a_synopsis_exists.
SYNOPSIS = "the flags' synopsis, not a command"
# Every block that does not run here, and why: (doc, why), in the docs' order.
NOT_RUN = [
    ("README.md", "makes a venv and installs from PyPI; the suite runs in a venv so made"),
    ("README.md", "runs the whole suite, of which this test is a part"),
    ("docs/accelerators.md", "needs a GPU and jax's CUDA wheels"),
    ("docs/accelerators.md", "needs WMT14 (wmt14.md) and a GPU"),
    ("docs/decoding.md", SYNOPSIS),
    ("docs/decoding.md", "needs serve.py running; tests/test_serve.py runs this client against it"),
    ("docs/decoding.md", "needs torch, transformers and ctranslate2 (a venv of their own) and "
     "an 800-step Multi30k model"),
    ("docs/multi_host.md", "needs a TPU VM slice and a GCS bucket"),
    ("docs/multi_host.md", "needs a SLURM cluster of GPU nodes and an S3 bucket"),
    ("docs/pretrained.md", "needs torch and transformers (a venv of their own); the suite checks "
     "the fixtures against their files"),
    ("docs/pretrained.md", "needs facebook/wmt19-en-de from the Hugging Face hub"),
    ("docs/provenance.md", "runs the suite once per mutant"),
    ("docs/training.md", SYNOPSIS),
    ("docs/wmt14.md", "downloads WMT14 (gigabytes) and trains the paper's base model"),
]

# The docs' placeholders, each bound to what it stands for here ('{tiny}': the trained
# workdir). Whole words; a train.py line's own --workdir stays a fresh folder.
PLACEHOLDERS = {
    "DIR": "{tiny}", "W": "{tiny}", "workdirs/multi30k_en-de": "{tiny}",
    "workdirs/a": "{tiny}", "workdirs/b": "{tiny}",
    "some_producer": "echo 'A dog runs.'", "some_consumer": "cat",
    "opus-mt-en-de": str(ROOT / "tests/fixtures/marian_swish_shared"),  # A tiny OPUS-MT.
    "nllb-200-distilled-600M": str(ROOT / "tests/fixtures/nllb"),  # A tiny NLLB-200.
}
# train.py: the tiny config's sizes (tests/conftest.train_command's run) for a few steps,
# after the doc's own overrides (the last wins); an init_from run's model and vocabulary
# are its source's, so it takes the rest (INIT_FROM_KEEPS left out).
TRAIN_OVERRIDES = [
    "--config.vocab_size=1000", "--config.vocab_max_sentences=5000",
    "--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_layers=1",
    "--config.model.max_len=64", "--config.max_source_length=32",
    "--config.max_target_length=32", "--config.batch_tokens=512",
    "--config.num_train_steps=3", "--config.warmup_steps=10", "--config.log_every_steps=1",
    "--config.eval_every_steps=1000", "--config.num_eval_steps=1",
    "--config.eval_max_shapes=1", "--config.bleu_every_steps=0",
    "--config.checkpoint_every_steps=1000",
]
INIT_FROM_KEEPS = ("--config.model.", "--config.vocab_")
# serve.py: a small batch ladder, so that it compiles few shapes before it serves.
SERVE_FLAGS = ["--max_tokens=16", "--max_batch=4", "--max_extra=5", "--cpu_devices=1"]
# Lines of the slice of test 2016 that test.en, test.de and prefixes.de hold, and that a
# block's `zcat ...test_2016_flickr...gz` gives.
SLICE = 8


def blocks(root: Path = ROOT, docs=DOCS) -> list[dict]:
  """Each bash or python block: doc, line, lang, code (dedented), marker (or None)."""
  found = []
  for doc in docs:
    text = (root / doc).read_text()
    for m in BLOCK.finditer(text):
      marker = MARKER.search(m["above"] or "")
      found.append({"doc": doc, "line": text[:m.start("indent")].count("\n") + 1,
                    "lang": m["lang"], "code": textwrap.dedent(m["body"]),
                    "marker": marker[1] if marker else None})
  return found


def bind(code: str, lang: str, tiny: str, port: int) -> str:
  """`code` with the placeholders bound, continuation lines joined."""
  code = code.replace("\\\n", " ")
  lines = []
  for line in code.splitlines():
    training = re.search(r"\bpython3?\s+\S*train\.py\b", line)
    for name, value in PLACEHOLDERS.items():
      value = value.format(tiny=tiny)
      if training:  # The run's own workdir stays a fresh folder; what it reads is bound.
        line = re.sub(rf"(--workdir=)({re.escape(name)})\b", r"\1@@\2", line)
      line = re.sub(rf"(?<![\w/.@-]){re.escape(name)}(?![\w/.-])", value, line)
      line = line.replace("@@", "")
    line = line.replace("8080", str(port))
    if lang == "bash":
      line = add_flags(line)
      # pip install -e '.[extra]': no network here; the extra must exist.
      line = re.sub(r"pip install -e '\.\[(\w+)\]'",
                    r"""python -c "import sys, tomllib; extras = tomllib.load(open('pyproject.toml', """
                    r"""'rb'))['project']['optional-dependencies']; assert '\1' in extras, '\1'" """,
                    line)
      # The slice: a whole test set is minutes of search on the tiny model here.
      line = re.sub(r"(zcat \S*test_2016_flickr\.\w+\.gz)", rf"\1 | sed -n 1,{SLICE}p", line)
    lines.append(line)
  return "\n".join(lines) + "\n"


# A command's arguments: words up to a shell operator, a redirection or a comment.
ARGS = r"((?:[ \t]+(?![|&;<>#)])\S+)*)"


def add_flags(line: str) -> str:
  line = re.sub(r"(\bpython3?\s+\S*train\.py)" + ARGS,
                lambda m: m[1] + m[2] + " " + " ".join(
                    o for o in TRAIN_OVERRIDES
                    if "--config.init_from=" not in m[2] or not o.startswith(INIT_FROM_KEEPS)),
                line)
  return re.sub(r"(\bpython3?\s+\S*serve\.py)" + ARGS,
                lambda m: m[1] + m[2] + " " + " ".join(SERVE_FLAGS), line)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def fresh_clone(folder: Path, multi30k_dir: str) -> tuple[Path, dict]:
  """(checkout, environment): a folder holding the checkout's files (linked), no
  ../shared beside it; a home whose Multi30k cache holds the public files (linked: what
  the first run fetches, checked by SHA-256 as fetched ones are) and whose compilation
  cache is the session's; test.en, test.de and prefixes.de, the slice of test 2016."""
  import gzip

  checkout, home = folder / "clone", folder / "home"
  checkout.mkdir(parents=True)
  for entry in ROOT.iterdir():
    if entry.name not in {".git", ".venv", "workdirs", ".pytest_cache", ".hypothesis"}:
      os.symlink(entry, checkout / entry.name)
  cache = home / ".cache" / "flax_transformer"
  (cache / "multi30k").mkdir(parents=True)
  for gz in Path(multi30k_dir).glob("*.gz"):
    os.symlink(gz, cache / "multi30k" / gz.name)
  os.symlink(conftest.XLA_CACHE, cache / "xla")
  for lang in ("en", "de"):
    with gzip.open(Path(multi30k_dir) / f"test_2016_flickr.{lang}.gz", "rt") as f:
      lines = [next(f) for _ in range(SLICE)]
    (checkout / f"test.{lang}").write_text("".join(lines))
  (checkout / "prefixes.de").write_text("Ein\n\nZwei\n" + "\n" * (SLICE - 3))
  bin_dir = str(Path(sys.executable).parent)
  env = dict(cpu_env(), HOME=str(home), PATH=f"{bin_dir}:{os.environ['PATH']}",
             PYTHONPATH=str(checkout))
  return checkout, env


def test_every_marker_is_listed():
  """The blocks that do not run are those NOT_RUN lists, each with its reason."""
  assert [(b["doc"], b["marker"]) for b in blocks() if b["marker"]] == NOT_RUN


def test_every_flag_of_a_synopsis_exists():
  """A synopsis does not run, but each `--flag` it names is one its script defines
  (`--helpfull`), and `--config.KEY` a key of the default config."""
  import ml_collections

  sys.path.insert(0, str(ROOT))
  from configs import default

  keys = {k for k, _ in ml_collections.ConfigDict(default.get_config()).items()}
  missing = []
  for block in (b for b in blocks() if b["marker"] == SYNOPSIS):
    script = re.search(r"\bpython\s+(\w+\.py)", block["code"])[1]
    helpfull = subprocess.run([sys.executable, str(ROOT / script), "--helpfull"], env=cpu_env(),
                              capture_output=True, text=True, timeout=120).stdout
    defined = set(re.findall(r"^\s+--(?:\[no\])?(\w+)", helpfull, re.M))
    assert "workdir" in defined, helpfull[-2000:]
    for flag in re.findall(r"--([\w.]+)", block["code"]):
      name, _, key = flag.partition(".")
      if (name not in defined) or (key and key.upper() != "KEY" and key.split(".")[0] not in keys):
        missing.append(f"{block['doc']}:{block['line']}: --{flag}")
  assert missing == []


BASH = [b for b in blocks() if b["lang"] == "bash" and not b["marker"]]


@pytest.mark.parametrize("block", BASH, ids=[f"{b['doc']}:{b['line']}" for b in BASH])
def test_bash_block_runs(block, trained_tiny, multi30k_dir, tmp_path):
  checkout, env = fresh_clone(tmp_path, multi30k_dir)
  script = bind(block["code"], "bash", str(trained_tiny), free_port())
  # curl fails on an HTTP error status, as a shown answer is a 2xx's.
  prelude = "curl() { command curl --fail-with-body \"$@\"; }\n"
  log = tmp_path / "block.log"
  with open(log, "w") as out:  # A file, not a pipe: a server the block started may outlive it.
    process = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", prelude + script],
                               cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
      code = process.wait(timeout=600)
    finally:  # Whatever the block left running (its process group) ends with it.
      try:
        os.killpg(process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      process.wait()
  assert code == 0, (f"{block['doc']}:{block['line']} exit {code}\n{script}\n"
                     f"{log.read_text()[-5000:]}")


RUNNER = """
import json, os, sys, traceback
failures = []
for folder, code, where in json.load(open(sys.argv[1])):
  os.chdir(folder)
  try:
    exec(compile(code, where, "exec"), {"__name__": "__main__"})
  except BaseException:
    failures.append(where + ": " + traceback.format_exc(limit=-3))
print(json.dumps(failures))
"""


def test_python_blocks_run(trained_tiny, multi30k_dir, tmp_path):
  """Every python block, in one process (one jax start), each from its own folder."""
  python = [b for b in blocks() if b["lang"] == "python" and not b["marker"]]
  jobs = []
  for i, block in enumerate(python):
    checkout, env = fresh_clone(tmp_path / str(i), multi30k_dir)
    jobs.append((str(checkout), bind(block["code"], "python", str(trained_tiny), 0),
                 f"{block['doc']}:{block['line']}"))
  (tmp_path / "jobs.json").write_text(json.dumps(jobs))
  done = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "jobs.json")], env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-4000:]
  failures = json.loads(done.stdout.splitlines()[-1])
  assert failures == [], "\n".join(failures)
