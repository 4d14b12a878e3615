#!/bin/bash
# Kernel and serving re-measurement on the GPU host (the `device` machine), one step per call, each
# under 10 minutes; results under $OUT. Steps:
#   tests    GPU tests of the kernels (m1, rotation, dense path, no local memory) and the serving
#            paths (graph vs eager, fused vs reference, packed tables)
#   matvec   one token through the Qwen3-8B projections: fp16, the no-weights control, tetra48-m1
#            with and without the preparation launches, the served pass, the rotations
#   sweep    the same after timing every m1 geometry per projection group (bench_matvec --sweep)
#   rotation the rotation kernel per width, both transform forms
#   smallm   M = 2, 4 and 8: the many-row m1 (the default for 2..8 rows; with the rotation: served)
#            vs the tiled kernel and the tensor-core kernel
#   batched  the many-row paths at M = 8 and 16: tiled kernel vs the
#            tensor-core kernel (three tiles; tetra48-mma-fused is the default 32x4, served for
#            9..16 rows, reading the compact table since 103a155) vs the float16 dequantized copy
#            on cuBLAS; then e2e 8B batch 16 (tensor-core path) with the dequantization kernel's
#            vector stores for the prefill (LEECHQ_DEQUANT_V4=1, opt-in, untimed so far)
#   e2e      decode tokens/s, Qwen3-8B at batch 1 and 16 (gates included), then Qwen3-14B batch 1
#   e2esmall decode tokens/s, Qwen3-8B at batch 2, 4 and 8 (the many-row m1 since 29e058b)
#   planes14 batch 1: the tiled Planes14 kernel vs the m1-geometry Planes14 kernel (the default
#            since 43f3e31; selectors from the table, then built in registers)
#   pending  what session g could not run on the GPU, in one call: the ball-coded served model
#            through Planes14 groups (LatticeGroup; logits vs reference, graph == eager), then
#            e2e 8B at batch 2, 4 and 8 with the fused pre-ops, and the ball model at batch 1
#   rotsplit several programs per (row, group) writing the prepared layout (ops.rotate_splits,
#            untimed): GPU tests of the rotation and the pre-ops at 1 and 4 programs, then the
#            arms rotation / norm-rotation against their -s4 forms (if -s4 wins: ROTATE_SPLITS)
#   p14rows  M = 2, 4 and 8 for Planes14: the tiled kernel vs the m1 kernel with several rows per
#            launch (opt-in since 8d3c209)
#   preops   the norms and the SwiGLU fused into the rotation launches (ops.norm_rotate /
#            silu_mul_rotate): GPU tests at the Qwen3 widths and in the served model, the fullgraph
#            compile test; bench arms norms vs norm-rotation (the rotation's cost is their
#            difference) beside served and rotation; e2e 8B batch 1, fused pre-ops vs separate
# Note: the device copy's .git may show an older HEAD; record the local sha with the results.
set -u
step=$1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
case $step in
tests)
  # -v into files: a run cut off by its time limit still shows which tests passed
  timeout 280 python -m pytest -m gpu -v -p no:cacheprovider tests/kernels/test_triton_gpu.py \
    -k "m1 or many_rows or rotation or no_local or dense_path or mma" > "$OUT/tests-kernels.log" 2>&1
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/tests-kernels.log" | cut -c1-150 | tail -30
  timeout 280 python -m pytest -m gpu -v -p no:cacheprovider tests/serve tests/nn tests/models \
    > "$OUT/tests-serve.log" 2>&1
  grep -E "FAILED|ERROR|passed|failed" "$OUT/tests-serve.log" | cut -c1-150 | tail -15
  ;;
matvec | sweep)
  extra=""
  [ "$step" = sweep ] && extra="--sweep"
  timeout 560 python benchmarks/bench_matvec.py --models qwen3-8b --batches 1 --rounds 3 --reps 5 \
    --no-sass --warm-workers 14 $extra \
    --arms fp16,null-m1-fused-noprep,tetra48-m1-fused-noprep,tetra48-m1-fused,served,rotation \
    --out "$OUT/matvec.json" 2>&1 | grep -v '^{"bench' | tail -30
  ;;
smallm)
  timeout 330 python benchmarks/bench_matvec.py --models qwen3-8b --batches 2,4,8 --rounds 3 \
    --reps 5 --no-sass --warm-workers 14 \
    --arms fp16,tetra48-fused,tetra48-m1-fused,served,tetra48-mma-fused \
    --out "$OUT/matvec-small-m.json" 2>&1 | grep -v '^{"bench' | tail -16
  ;;
batched)
  timeout 150 python benchmarks/bench_matvec.py --models qwen3-8b --batches 8 --rounds 3 --reps 5 \
    --no-sass --warm-workers 14 \
    --arms fp16,tetra48-fused,tetra48-mma-fused,tetra48-mma64x2w4-fused,tetra48-mma128x2w8-fused,tetra48-dense-fused \
    --out "$OUT/matvec-m8.json" 2>&1 | grep -v '^{"bench' | tail -8
  timeout 120 python benchmarks/bench_matvec.py --models qwen3-8b --batches 16 --rounds 3 --reps 5 \
    --no-sass --warm-workers 14 \
    --arms fp16,tetra48-mma-fused,tetra48-mma64x2w4-fused,tetra48-mma128x2w8-fused,tetra48-dense-fused \
    --out "$OUT/matvec-m16.json" 2>&1 | grep -v '^{"bench' | tail -6
  LEECHQ_DEQUANT_V4=1 timeout 220 python benchmarks/bench_e2e.py --quick \
    --models qwen3-8b --arms fp16,tetra48 --batches 16 --no-profile --budget-s 180 \
    --out "$OUT/e2e-8b-b16.json" > "$OUT/e2e-8b-b16.log" 2>&1
  grep "tok/s\|status" "$OUT/e2e-8b-b16.log" | cut -c1-200
  ;;
rotation)
  timeout 300 python benchmarks/bench_rotation.py --out "$OUT/rotation.json" 2>&1 \
    | grep -v '^{"bench'
  ;;
e2e)
  timeout 330 python benchmarks/bench_e2e.py --quick --models qwen3-8b --arms fp16,tetra48 \
    --batches 1,16 --no-profile --budget-s 230 --out "$OUT/e2e-8b.json" > "$OUT/e2e-8b.log" 2>&1
  grep "tok/s\|status" "$OUT/e2e-8b.log" | cut -c1-200
  timeout 240 python benchmarks/bench_e2e.py --quick --models qwen3-14b --arms fp16,tetra48 \
    --batches 1 --skip-gates --no-profile --budget-s 200 --out "$OUT/e2e-14b.json" \
    > "$OUT/e2e-14b.log" 2>&1
  grep "tok/s" "$OUT/e2e-14b.log" | cut -c1-200
  ;;
planes14)
  timeout 330 python benchmarks/bench_matvec.py --models qwen3-8b --batches 1 --rounds 3 --reps 5 \
    --no-sass --warm-workers 14 --arms fp16,planes14-fused,planes14-m1-fused \
    --out "$OUT/matvec-planes14.json" 2>&1 | grep -v '^{"bench' | tail -6
  echo "# the same, selectors built in registers (LEECHQ_P14_SELECTORS=0)"
  LEECHQ_P14_SELECTORS=0 timeout 200 python benchmarks/bench_matvec.py --models qwen3-8b \
    --batches 1 --rounds 3 --reps 5 --no-sass --warm-workers 14 --arms fp16,planes14-m1-fused \
    --out "$OUT/matvec-planes14-regsel.json" 2>&1 | grep -v '^{"bench' | tail -3
  ;;
pending)
  timeout 150 python -m pytest -m gpu -v -p no:cacheprovider \
    tests/serve/test_gpu.py::test_fused_ball_model_matches_reference \
    > "$OUT/tests-pending.log" 2>&1
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/tests-pending.log" | cut -c1-150 | tail -20
  grep -E "^E " "$OUT/tests-pending.log" | cut -c1-300 | head -10
  timeout 280 python benchmarks/bench_e2e.py --quick --models qwen3-8b --arms fp16,tetra48 \
    --batches 2,4,8 --skip-gates --no-profile --budget-s 250 --out "$OUT/e2e-8b-small.json" \
    > "$OUT/e2e-8b-small.log" 2>&1
  grep "tok/s" "$OUT/e2e-8b-small.log" | cut -c1-200
  timeout 150 python benchmarks/bench_e2e.py --quick --models qwen3-8b --arms fp16,ball \
    --batches 1 --skip-gates --no-profile --budget-s 130 --out "$OUT/e2e-8b-ball.json" \
    > "$OUT/e2e-8b-ball.log" 2>&1
  grep "tok/s" "$OUT/e2e-8b-ball.log" | cut -c1-200
  ;;
rotsplit)
  timeout 200 python -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_triton_norm_rotate.py \
    tests/kernels/test_triton_gpu.py -k "rotation_widths or pre_ops" > "$OUT/tests-rotsplit.log" 2>&1
  grep -E "FAILED|ERROR|passed|failed" "$OUT/tests-rotsplit.log" | cut -c1-150 | tail -8
  timeout 200 python benchmarks/bench_matvec.py --models qwen3-8b --batches 1 --rounds 3 --reps 5 \
    --no-sass --warm-workers 14 \
    --arms fp16,served,rotation,rotation-s4,norms,norm-rotation,norm-rotation-s4 \
    --out "$OUT/matvec-rotsplit.json" 2>&1 | grep -v '^{"bench' | tail -10
  ;;
p14rows)
  timeout 400 python benchmarks/bench_matvec.py --models qwen3-8b --batches 2,4,8 --rounds 3 \
    --reps 5 --no-sass --warm-workers 14 --arms fp16,planes14-fused,planes14-m1-fused \
    --out "$OUT/matvec-planes14-rows.json" 2>&1 | grep -v '^{"bench' | tail -12
  ;;
preops)
  timeout 170 python -m pytest -m gpu -v -p no:cacheprovider \
    tests/nn/test_linear.py::test_cuda_forward_compiles_fullgraph \
    tests/kernels/test_triton_norm_rotate.py tests/serve/test_gpu.py > "$OUT/tests-preops.log" 2>&1
  grep -E "FAILED|ERROR|passed|failed" "$OUT/tests-preops.log" | cut -c1-150 | tail -12
  grep -E "^E " "$OUT/tests-preops.log" | cut -c1-300 | head -20
  timeout 150 python benchmarks/bench_matvec.py --models qwen3-8b --batches 1,2 --rounds 3 \
    --reps 5 --no-sass --warm-workers 14 --arms fp16,served,rotation,norms,norm-rotation \
    --out "$OUT/matvec-preops.json" 2>&1 | grep -v '^{"bench' | tail -12
  timeout 250 python benchmarks/bench_e2e.py --quick --models qwen3-8b \
    --arms fp16,tetra48,tetra48-unfused --batches 1 --skip-gates --no-profile --budget-s 220 \
    --out "$OUT/e2e-8b-preops.json" > "$OUT/e2e-8b-preops.log" 2>&1
  grep "tok/s" "$OUT/e2e-8b-preops.log" | cut -c1-200
  ;;
e2esmall)
  timeout 400 python benchmarks/bench_e2e.py --quick --models qwen3-8b --arms fp16,tetra48 \
    --batches 2,4,8 --skip-gates --no-profile --budget-s 330 --out "$OUT/e2e-8b-small.json" \
    > "$OUT/e2e-8b-small.log" 2>&1
  grep "tok/s" "$OUT/e2e-8b-small.log" | cut -c1-200
  ;;
*)
  echo "unknown step $step (tests | matvec | sweep | smallm | batched | rotation | e2e | e2esmall | planes14 | pending | p14rows | preops | rotsplit)" >&2
  exit 2
  ;;
esac
