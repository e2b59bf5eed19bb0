#!/usr/bin/env bash
# One device call: bench/accelerator.py's model-step and search sections under
# XLA's default flags, then under each variant flag set below, every variant in
# its own process with the peer measured beside ours (ratios within a variant).
#
#   PLAN=first|second bash bench/accelerator_variants.sh OUT_DIR [accelerator.py args...]
#
# accelerator.py adds the entry points' default XLA flags (compilation.DEFAULT_XLA_FLAGS)
# to each variant's, from run 5 on. Writes OUT_DIR/<variant>.json and OUT_DIR/<variant>.log. Each process has a
# wall-clock cap (VARIANT_LIMIT_S, default 130 s; the first gets twice that) and
# accelerator.py rewrites its JSON after every section, so a cap loses one section.
set -u
out=$1; shift
bench_args=("$@")
limit=${VARIANT_LIMIT_S:-130}
mkdir -p "$out"

run() {  # name, XLA_FLAGS, sections, wall-clock cap in seconds
  echo "== $1 (XLA_FLAGS='$2', sections $3, cap $4 s)"
  XLA_FLAGS="$2" PYTHONUNBUFFERED=1 timeout "$4" python3 bench/accelerator.py "${bench_args[@]}" \
    --sections="$3" --budget_s="$(( $4 - 15 ))" --out="$out/$1.json" \
    > "$out/$1.log" 2>&1
  echo "   exit $? after $SECONDS s in all"; tail -n 25 "$out/$1.log"
}

case "${PLAN:-first}" in
first)  # Run 3 (2026-11-26).
  # 1. Defaults: the headline rows (base bf16 first: it had never been measured).
  run default "" base_bf16,small_f32,decode_vs_peer $(( 2 * limit ))
  # 2. While loops and conditionals inside CUDA graphs: the search's loop and a
  #    step without a host round trip per iteration.
  run command_buffers \
    "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL" \
    small_f32,decode_vs_peer "$limit"
  # 3. cuBLAS only, no Triton GEMM autotuning: compile time against step time.
  run no_triton_gemm "--xla_gpu_enable_triton_gemm=false" small_f32,decode_vs_peer "$limit"
  ;;
second)  # Run 4: after run 3 found cuBLAS-only faster to compile and to run at small f32.
  # 1. cuBLAS only at the paper's base shape, and which hand-written piece of our
  #    step costs time (ablations, beside ours and the peer).
  run no_triton_gemm "--xla_gpu_enable_triton_gemm=false" base_bf16,small_f32_ablations \
    $(( 2 * limit ))
  # 2. Defaults at small f32 (run 3 ran out of budget before it).
  run default "" small_f32 "$(( limit - 30 ))"
  ;;
third)  # Next: the library's defaults (Triton GEMMs off since run 4), then threefry
  # as one CUDA kernel (XLA's unrolled threefry is most of the parameter-init
  # and much of the train-step compile: 10k ops in the small model's init HLO).
  run defaults "" small_f32_ablations,decode_vs_peer $(( 2 * limit ))
  JAX_THREEFRY_GPU_KERNEL_LOWERING=1 run threefry_kernel "" base_bf16,small_f32 "$limit"
  run readme_job "" readme_job,warm_compile,readme_step "$(( 2 * limit ))"
  ;;
*) echo "unknown PLAN=$PLAN (first, second, third)"; exit 2 ;;
esac

python3 - "$out" <<'PY'
import json, pathlib, sys
print(f"{'variant':16} {'section':15} {'ours ms':>8} {'peer ms':>8} {'x peer':>7} {'compile s':>9} {'peer comp':>9} {'MFU':>6}")
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
  record = json.loads(path.read_text())
  for name in ("base_bf16", "small_f32", "decode_vs_peer"):
    r = record.get(name)
    if not r:
      continue
    ours = r.get("ours_ms", 1000 * r.get("ours_s_per_batch", 0))
    peer = r.get("peer_ms", 1000 * r.get("peer_s_per_batch", 0) if "peer_s_per_batch" in r else 0)
    print(f"{path.stem:16} {name:15} {ours:8.2f} {peer or 0:8.2f} {r.get('speedup_vs_peer') or 0:7.2f} "
          f"{r.get('ours_compile_s') or 0:9.1f} {r.get('peer_compile_s') or 0:9.1f} "
          f"{r.get('ours_mfu_of_bf16_peak') or 0:6.1%}")
  for key, r in record.get("small_f32_ablations", {}).items():
    print(f"{path.stem:16} {key:25} {r['ms']:8.2f} ms = {r['over_ours']:.2f}x ours, compile {r['compile_s']:.1f} s")
  w = record.get("small_f32_with_ablations")
  if w:
    print(f"{path.stem:16} {'(ours, peer there)':25} {w['ours_ms']:8.2f} {w.get('peer_ms') or 0:8.2f} ms")
PY
