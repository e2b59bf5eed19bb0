"""Peak memory of import_model.py on a model of NLLB-200-distilled-600M's shape (d_model
1024, 12 + 12 layers, d_ff 4096, 16 heads, 256,206 ids; random weights, built and saved by
transformers): the import streams tensors, so its peak RSS should stay within the
folder's size plus 1 GB (issue 77). Prints a table, writes JSON.

  python bench/import_memory.py --folder=/tmp/nllb600m_random --make_with=/work/hfvenv/bin/python \
    --json=results/bench/import_memory.json
--make_with: a Python with torch and transformers that builds the folder when it is
absent (the tokenizer's files are tests/fixtures/nllb's: a model may have more rows than
its tokenizer has ids, as NLLB's has 2). The embedding rows (tied to the output
projection; M2M100's lm_head has no bias) of the ids that tokenizer lacks (all but its
407) are zeros: their logits are 0 while the real pieces' spread around 0, so generation
picks real pieces and outputs decode to text (bench/nllb_speed.py compares texts; with
random rows both engines emitted ids the tokenizer cannot spell and every output was
empty). Shape, size and dtype are unchanged.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, bench_command, dir_bytes, machine, parser, print_table, write_json

SHAPE = dict(vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12,
             encoder_ffn_dim=4096, decoder_ffn_dim=4096, encoder_attention_heads=16,
             decoder_attention_heads=16, max_position_embeddings=1024)
MAKE = """
import sys, torch
from transformers import AutoTokenizer, M2M100Config, M2M100ForConditionalGeneration
torch.manual_seed(0)
config = M2M100Config(**{shape}, scale_embedding=True, pad_token_id=1, bos_token_id=0,
                      eos_token_id=2, decoder_start_token_id=2, dropout=0.1)
model = M2M100ForConditionalGeneration(config)
spelled = torch.zeros(config.vocab_size, dtype=torch.bool)
spelled[list(AutoTokenizer.from_pretrained(sys.argv[2]).get_vocab().values())] = True
assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr(), "not tied"
assert model.lm_head.bias is None, "lm_head has a bias"
with torch.no_grad():
  model.model.shared.weight[~spelled] = 0
model.save_pretrained(sys.argv[1], safe_serialization=True)
"""
CONVERT_ONLY = """
import resource, sys
from flax_transformer.pretrained import importer
importer.import_folder(sys.argv[1], sys.argv[2])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
TOKENIZER = ("sentencepiece.bpe.model", "tokenizer.json", "tokenizer_config.json")


def make(folder: Path, python: str) -> None:
  folder.mkdir(parents=True)
  fixture = ROOT / "tests" / "fixtures" / "nllb"
  subprocess.run([python, "-c", MAKE.format(shape=SHAPE), str(folder), str(fixture)], check=True)
  for name in TOKENIZER:
    shutil.copy(fixture / name, folder / name)


def main() -> int:
  flags = parser(__doc__)
  flags.add_argument("--folder", required=True)
  flags.add_argument("--make_with", help="a Python with torch and transformers")
  flags.add_argument("--dtype", default="float32", choices=("float32", "stored"))
  args = flags.parse_args()
  folder = Path(args.folder)
  if not folder.is_dir():
    if not args.make_with:
      print(f"--folder={folder} does not exist: give --make_with", file=sys.stderr)
      return 2
    make(folder, args.make_with)
  commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "import_model.py"), f"--from={folder}",
                    f"--workdir={tmp}/run", f"--dtype={args.dtype}"], check=True)
    seconds = time.perf_counter() - start
    workdir_bytes = dir_bytes(Path(tmp) / "run")
  peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux.
  # The conversion alone (read, permute, build the tree; no checkpoint written), in a
  # process of its own that reports its own peak.
  convert_peak = int(subprocess.run(
      [sys.executable, "-c", CONVERT_ONLY, str(folder), args.dtype], cwd=ROOT, check=True,
      capture_output=True, text=True).stdout.split()[-1]) * 1024
  size = dir_bytes(folder)
  row = {"folder_gb": size / 1e9, "peak_rss_gb": peak / 1e9,
         "convert_peak_rss_gb": convert_peak / 1e9, "limit_gb": (size + 1e9) / 1e9,
         "within": peak <= size + 1e9, "convert_within": convert_peak <= size + 1e9,
         "seconds": seconds, "workdir_gb": workdir_bytes / 1e9}
  print_table([row], list(row))
  write_json(args.json, {"command": bench_command(), "commit": commit, "shape": SHAPE,
                         "dtype": args.dtype, "machine": machine(), **row,
                         "folder_bytes": size, "peak_rss_bytes": peak,
                         "convert_peak_rss_bytes": convert_peak})
  return 0


if __name__ == "__main__":
  sys.exit(main())
