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
#   pending  what session i could not run on the GPU: the Planes14 dense path and the
#            rotation-written int8 records (tests), the served tests, e2e of the ball model
#            at batch 1 and 8 (the 8-row prompt takes the dense path)
#   rotsplit several programs per (row, group) writing the prepared layout (ops.rotate_splits):
#            GPU tests of the rotation and the pre-ops at 1, 4 and 8 programs and of the ball
#            model, the arms rotation / norm-rotation against their -s2/-s4/-s8 forms, the served
#            pass and e2e 8B batch 1 with LEECHQ_ROT_SPLITS=4
#   imma     the int8 tensor-core kernel for 2..8 rows (ops.tetra48_matvec_imma_prepared): its GPU
#            tests (PTX helpers vs emulation, full shapes vs f64, offline SASS), then M = 2, 4, 8
#            against the many-row m1 (the default), with and without the preparation launches
#   imma2    the int8 tensor-core kernel as the default for 4..8 rows (ops.IMMA_MIN_ROWS): M = 2, 3,
#            4, 8 against the many-row m1, then its GPU tests and the serving and linear-layer
#            GPU tests (graph == eager, fused vs reference, the fullgraph compile) on that default
#   imma3    the slices added inside the int8 kernel (ops.IMMA_FUSED_SUM, off) and Planes14 records
#            through it (ops.planes14_matvec_imma_prepared, opt-in), both untested on a GPU: the
#            GPU tests, M = 3 and 8 against the slice-sum launch and against Planes14's many-row
#            m1, then the fullgraph compile test (not reached in session h) and the serving tests
#   p14dense the ball codebook's many-row path (ops.planes14_matmul_dense, default from 17 rows
#            since session i, never run on a GPU): its GPU tests (bit-exact dequantization, the
#            GEMM, the offline compile), the served ball model tests, then e2e ball at batch 1
#            and 8 (prefill of 32 and 256 rows; 141 and 849 ms before)
#   rotrec   the int8 kernel's activation records written by one-group rotations (the default
#            since session j): its GPU tests, the serving tests with and without them, then e2e
#            at batch 4 and 8 against the records launch (arm tetra48-norotrec)
#   mid      9..16 rows end to end: 8-row chunks on the int8 kernel (the default since session
#            j) against the float16 tensor-core kernel (arm tetra48-mma, LEECHQ_MMA=1)
#   imma16   9..16 activation rows in one int8 launch (two 8-row chunks of records, each decoded
#            block meeting both; session j): GPU tests, matvec at 8 and 16 rows, serving tests,
#            e2e at batch 12 and 16 (two 8-row launches: 12.19 and 12.36 ms per step)
#   dense    the serving GPU tests, then where the float16 dequantized copy starts to pay now that
#            16 rows take one int8 launch: e2e at batch 1 (32-row prompt), 9, 32 and 64 with the
#            copy from 17 rows (default) and from 129 (arm tetra48-dense129)
#   final    session j's defaults (16 rows per int8 launch, the dequantized copy from 65 rows):
#            the serving GPU tests, then e2e Tetra and ball at batch 16, 32 and 64
#   p14rows  M = 2, 4 and 8 for Planes14: the tiled kernel vs the m1 kernel with several rows per
#            launch (opt-in since 8d3c209)
#   preops   the norms and the SwiGLU fused into the rotation launches (ops.norm_rotate /
#            silu_mul_rotate): GPU tests at the Qwen3 widths and in the served model, the fullgraph
#            compile test; bench arms norms vs norm-rotation (the rotation's cost is their
#            difference) beside served and rotation; e2e 8B batch 1, fused pre-ops vs separate
#   dequant  the dequantization kernels' store forms (session k: magic-number conversion, grouped
#            column layout, 16-byte stores, geometry): their GPU tests (bit-exact against the twins,
#            offline SASS), bench_dequant.py on Qwen3-8B groups, then the int8 kernel's GPU tests
#            (review commit c782008, not run on a GPU in session j)
#   densek   the serving GPU tests on the new dequantization default, then where the float16
#            copy starts to pay now that it is 7.5x faster: e2e Tetra at batch 1 (32-row prompt),
#            16, 32 and 64 with the copy from 65 rows (default) and from 9 (arm tetra48-dense9)
#   densekb  the same for the ball model (arms ball, ball-dense9) at batch 1, 16 and 64
#   densek2  session k's defaults (the copy from 17 rows, the norm/SwiGLU fused into its rotation,
#            σ_row and the tail in two launches): the dense path per step (bench_dequant; on
#            2026-12-01 also in L2-sized row chunks, measured slower and removed), dense-path and
#            serving GPU tests, then e2e
#            fp16 / Tetra / ball at batch 1, 16, 17, 32 and 64
#   densek3  the GPU tests of the dense path, the dequantization compile, the serving paths and the
#            fullgraph compile on session k's final tree, then where the copy starts to pay
#            against 16 + k rows on the int8 kernel: e2e Tetra at batch 20 and 24, the copy
#            (default) against the int8 kernel (arm tetra48-dense129)
#   densek14 the dense-path GPU tests (one helper for the dequantization forms since ab58875),
#            then Qwen3-14B end to end at batch 1 and 32 (fp16 against Tetra, the copy at 32)
#   densek5  the rotation writing the copies' column order in float16 and the one-launch epilogue
#            (ops.matmul_dense_ordered): the serving GPU tests that take the copy (70-row pre-ops,
#            ball batch 6 and 22, logits vs reference), then e2e Tetra at batch 32 and 64
#   pendingk what session k could not run on the GPU after f3d049b (the rotation writing the
#            copies' column order, the one-launch epilogue): the new rotation test at the Qwen3
#            widths, the dense-path and rotation kernel tests, all serving GPU tests and the
#            fullgraph compile, then e2e fp16 / Tetra / ball at batch 16, 32 and 64 (same-process
#            ratios for the ordered products)
#   pdl      programmatic dependent launch of the batch-1 chain (rotations and m1 matvecs, ops.PDL_DEFAULT):
#            the m1 / rotation kernel tests and the serving GPU tests with it, then one token's
#            projections (m1 alone and the served pass) with and without it (LEECHQ_PDL=0)
#   pdle2e   e2e Qwen3-8B at batch 1: fp16, Tetra and ball with and without PDL
#   pdl2     PDL on the int8 tensor-core kernel and its slice sum too (3..16 rows): the kernel GPU
#            tests the first pdl run did not reach (Planes14 m1, many-row m1, rotation widths,
#            int8 full shapes), then e2e Qwen3-8B Tetra at batch 4, 8 and 16 with and without PDL,
#            then the served graph == eager and ball-model tests (3..22 rows)
#   pdl3     PDL off for the int8 kernel again (ops.IMMA_PDL; slower with it in pdl2): e2e Qwen3-8B
#            Tetra at batch 1, 4 and 8 with and without PDL (rotations and m1 only)
#   pdl4     the final rule (PDL for the rotations only where m1 takes the rows, < 3): e2e Qwen3-8B
#            Tetra at batch 1, 2 and 4 with and without PDL
#   pdlnext  what session l could not run under PDL: the kernel GPU tests its steps did not reach
#            (the 24-row m1 shape, Planes14 many rows, rotation widths, no local memory), e2e
#            Qwen3-14B at batch 1 with and without PDL, then the m1 geometry sweep (staging is
#            now hidden, so the best chunk per shape may have moved)
#   limbs    the rotation-written limb records of the batch-1 kernel (opt-in): their GPU tests
#            and the serving tests, then the served pass with and without them (Qwen3-8B,
#            batch 1; the rotations alone with them at 8 and 16 programs per row)
#   limbse2e e2e Qwen3-8B at batch 1 and 2, Tetra and ball, with and without the limb records
#   rotorder the GPU rotation tests after the prepared tile's row order changed, then e2e
#            Qwen3-8B batch 1 (fp16, Tetra, ball)
#   a16      16-bit activations (the default since session n): the serving GPU tests, e2e Qwen3-8B at
#            batch 1, 4 and 8 against the 24-bit arm (LEECHQ_A16=0)
#   a16b     the A16 GPU tests and the full-shape m1 / int8 tests (24 bits), the matvec at two rows,
#            e2e batch 1 and 2 (ball 16 against 24 bits, Tetra)
#   e2eprof  e2e Qwen3-8B at batch 1 and 8 with the eager-step profile (kernels per step and the
#            top kernels by GPU time): where the ~0.6 ms per step beyond the served projections go
#   caps     with 16-bit activations one-row m1 fits 80 (or 72) registers without spilling and
#            two-row m1 96 (offline): batch 1 under caps 80/72 with chunks for 5 or 6 programs
#            per SM, batch 2 with chunks for 4 or 5 (the rules assume 5 and 3); the int8 kernel
#            at 4 and 8 rows with four row groups per step (rows_per_step=4) against two
#   korder   the batch-1 m1 kernel on Tetra words in kernel order (formats.layouts.tetra48_korder;
#            offline 393 instead of 458 instructions per loop trip): its GPU tests, then one and
#            two rows, prepared and served, against the standard order; the int8 kernel at 8
#            rows (offline 313 instead of 334 instructions per step)
#   kordere2e Qwen3-8B end to end at batch 1 and 8 with kernel-order words (tetra48-korder)
#   pendingm what session m could not run: the int8 kernel's activation records from the
#            prepared write's tile (GPU tests, the serving tests), e2e Qwen3-8B at batch 2 (PDL
#            for one row only), 4 and 8 (the records path; tetra48-norotrec: their own launch)
#   t64      the tetra64 layout (formats.layouts.tetra64, the served default since session p): its
#            GPU tests (m1 full shapes, the default path at 3..20 rows) and the serving tests,
#            then one token through the Qwen3-8B projections against the standard layout
#   t64sweep the m1 geometry sweep on tetra64 records (bench_matvec --sweep --sweep-t64)
#   t64e2e   e2e Qwen3-8B at batch 1, 2 and 8 (tetra48 = tetra64, tetra48-std) and Qwen3-14B at
#            batch 1
#   pbits    the tetra64 decode's pattern-bits tables (16 / 32 copies, tetra48_m1.decode_block64_bits)
#            and the warps' shared activation conversion (XS): their GPU tests (full shapes, bit for
#            bit), then one token through the Qwen3-8B projections against the 16-byte table, the
#            control in the tetra64 geometry, chunks for six programs per SM, and Planes14 m1
#   geo      the tetra64 geometry with fewer, wider programs (8 or 16 warps, sized for 2 or 1 per
#            SM: one staged table per 16 warps instead of per 4) and the 8-copy pattern-bits table
#            (20 KiB staged): GPU tests, then one token through the Qwen3-8B projections
#   pb8      the 8-copy pattern-bits table as the served default (ops.T64_PBITS): the tetra64 and
#            bits kernel tests and the fused serving tests on the GPU, then e2e Qwen3-8B at batch 1
#            against the 16-byte entries (arm tetra48-pb0)
#   pb8e2e   e2e Qwen3-14B at batch 1 with the 8-copy pattern-bits table against the 16-byte entries
#   prefetch the batch-1 kernel's L2 prefetch of each program's rows before the grid wait
#            (LEECHQ_M1_PREFETCH, ops.m1_prefetch): its GPU tests, then one token through the
#            Qwen3-8B projections with and without it (m1 alone, the served pass, Planes14)
#   wait     where the batch-1 m1 program waits for the previous grid (LEECHQ_M1_WAIT: 2 after
#            its staging and first words, the default; 1 after the staging; 0 first): the PDL
#            and tetra64 GPU tests at each, registers of the variants under this Triton, then one
#            token through the Qwen3-8B projections (m1 alone and the served pass)
#   split    the pattern XOR merged into the nibble masks (ops.T64_SPLIT, the default since
#            session r; LEECHQ_T64_SPLIT=0 keeps it apart): one token through the Qwen3-8B
#            projections both ways (m1 alone and the served pass), then the tetra64 GPU tests
#            (bits full shapes with the XOR apart too, the default plans) and the fused serving
#   splite2e e2e Qwen3-8B at batch 1, the XOR merged (default) against apart (tetra48-nosplit)
#   split14b the same for Qwen3-14B at batch 1
#   peel     the tetra64 batch-1 kernel's first trip decoded before the grid wait
#            (LEECHQ_T64_PEEL, ops.t64_peel): its GPU tests, then one token through the Qwen3-8B
#            projections with and without it (m1 alone and the served pass, twice each)
#   breakdown where a served step's time goes (benchmarks/step_breakdown.py): Qwen3-8B at batch
#            1, fp16 and tetra48, the decode step's kernels by kind under its graph and the
#            prefill of 32 and 512 tokens (wall, device busy, host operators)
#   attn     the decode step's split-key attention kernel (ops.decode_attention, the default on
#            CUDA) and the captured prefill per bucket width: their GPU tests and the serving GPU
#            tests, then the step by kernel kind (fp16, tetra48 with and without the kernel) at
#            1024 slots and the prefill of 32 and 512 tokens
#   attne2e  e2e Qwen3-8B batch 1 with and without the kernel (fp16-sdpa, tetra48-sdpa), at the
#            default 128-slot cache and at 4096 slots
#   epilogue the many-row epilogue with 16 activation rows per program (ops.EPILOGUE_ROWS): the
#            dense-path GPU tests, the prefill breakdown of Tetra and ball at 32 and 512 tokens,
#            then e2e Qwen3-14B batch 1 (the decode attention kernel, the captured prefill)
#   attnw    the decode attention kernel writing the step's key and value into the cache (no
#            index_copy_ launches): GPU tests, the decode step by kernel kind at 1024 slots, e2e
#            Qwen3-8B batch 1 at 128 and 4096 slots
#   prefillc the prefill's pieces compiled with symbolic sizes (Engine.prefill_fns): the serving
#            GPU tests of graphs, prefill and compiled pieces, the prefill breakdown at 32 and 512
# Note: the device copy's .git may show an older HEAD; record the local sha with the results.
set -u
step=$1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

# gpu_tests NAME TIMEOUT PYTEST_ARGS...: `pytest -m gpu -v` into $OUT/NAME.log (a run cut off by
# its time limit still shows which tests passed), then the outcome lines and the first errors
gpu_tests() {
  local log="$OUT/$1.log" limit=$2
  shift 2
  timeout "$limit" python -m pytest -m gpu -v -p no:cacheprovider "$@" > "$log" 2>&1
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$log" | cut -c1-150 | tail -30
  grep -E "^E " "$log" | cut -c1-300 | head -10
}

# matvec NAME TIMEOUT ARGS...: bench_matvec on Qwen3-8B shapes (3 rounds x 5 replays, no SASS
# report) into $OUT/NAME.json; prints its table (not the JSON line)
matvec() {
  local out="$OUT/$1.json" limit=$2
  shift 2
  timeout "$limit" python benchmarks/bench_matvec.py --models qwen3-8b --rounds 3 --reps 5 \
    --no-sass --warm-workers 14 "$@" --out "$out" 2>&1 | grep -v '^{"bench' | tail -30
}

# e2e NAME TIMEOUT ARGS...: bench_e2e --quick into $OUT/NAME.{json,log}; prints the rates
e2e() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python benchmarks/bench_e2e.py --quick "$@" --out "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1
  grep "tok/s\|status" "$OUT/$name.log" | cut -c1-200
}

# e2e_b1 NAME TIMEOUT MODEL ARM BUDGET: e2e of MODEL at batch 1, fp16 and tetra48 against ARM
e2e_b1() {
  e2e "$1" "$2" --models "$3" --arms "fp16,tetra48,$4" --batches 1 --skip-gates --no-profile \
    --budget-s "$5"
}

case $step in
tests)
  gpu_tests tests-kernels 280 tests/kernels/test_triton_gpu.py \
    -k "m1 or many_rows or rotation or no_local or dense_path or mma"
  gpu_tests tests-serve 280 tests/serve tests/nn tests/models
  ;;
matvec | sweep)
  extra=()
  [ "$step" = sweep ] && extra=(--sweep)
  matvec matvec 560 --batches 1 "${extra[@]}" \
    --arms fp16,null-m1-fused-noprep,tetra48-m1-fused-noprep,tetra48-m1-fused,served,rotation
  ;;
smallm)
  matvec matvec-small-m 330 --batches 2,4,8 \
    --arms fp16,tetra48-fused,tetra48-m1-fused,served,tetra48-mma-fused
  ;;
batched)
  matvec matvec-m8 150 --batches 8 \
    --arms fp16,tetra48-fused,tetra48-mma-fused,tetra48-mma64x2w4-fused,tetra48-mma128x2w8-fused,tetra48-dense-fused
  matvec matvec-m16 120 --batches 16 \
    --arms fp16,tetra48-mma-fused,tetra48-mma64x2w4-fused,tetra48-mma128x2w8-fused,tetra48-dense-fused
  LEECHQ_DEQUANT_V4=1 e2e e2e-8b-b16 220 --models qwen3-8b --arms fp16,tetra48 --batches 16 \
    --no-profile --budget-s 180
  ;;
rotation)
  timeout 300 python benchmarks/bench_rotation.py --out "$OUT/rotation.json" 2>&1 \
    | grep -v '^{"bench'
  ;;
e2e)
  e2e e2e-8b 330 --models qwen3-8b --arms fp16,tetra48 --batches 1,16 --no-profile \
    --budget-s 230
  e2e e2e-14b 240 --models qwen3-14b --arms fp16,tetra48 --batches 1 --skip-gates --no-profile \
    --budget-s 200
  ;;
planes14)
  matvec matvec-planes14 330 --batches 1 --arms fp16,planes14-fused,planes14-m1-fused
  echo "# the same, selectors built in registers (LEECHQ_P14_SELECTORS=0)"
  LEECHQ_P14_SELECTORS=0 matvec matvec-planes14-regsel 200 --batches 1 \
    --arms fp16,planes14-m1-fused
  ;;
pending)
  gpu_tests tests-p14dense 150 tests/kernels/test_triton_gpu.py -k "planes14_dense or planes14_dequant"
  gpu_tests tests-records 100 tests/kernels/test_triton_norm_rotate.py -k records
  gpu_tests tests-serve 200 tests/nn/test_linear.py::test_cuda_forward_compiles_fullgraph \
    tests/serve/test_gpu.py
  e2e e2e-8b-ball 250 --models qwen3-8b --arms fp16,ball --batches 1,8 --skip-gates \
    --no-profile --budget-s 220
  ;;
rotsplit)
  gpu_tests tests-rotsplit 200 tests/kernels/test_triton_norm_rotate.py \
    tests/kernels/test_triton_gpu.py -k "rotation_widths or pre_ops"
  gpu_tests tests-ball 120 tests/serve/test_gpu.py::test_fused_ball_model_matches_reference
  matvec matvec-rotsplit 200 --batches 1 --arms fp16,served,rotation,rotation-s2,rotation-s4,\
rotation-s8,norms,norm-rotation,norm-rotation-s2,norm-rotation-s4,norm-rotation-s8
  echo "# served (its rotations) with LEECHQ_ROT_SPLITS=4"
  LEECHQ_ROT_SPLITS=4 matvec matvec-rotsplit-served4 120 --batches 1 --arms fp16,served
  LEECHQ_ROT_SPLITS=4 e2e e2e-8b-s4 200 --models qwen3-8b --arms fp16,tetra48 --batches 1 \
    --skip-gates --no-profile --budget-s 170
  ;;
imma)
  gpu_tests tests-imma 240 tests/kernels/test_triton_gpu.py -k "imma"
  matvec matvec-imma 330 --batches 2,4,8 --arms fp16,tetra48-m1-fused,tetra48-m1-fused-noprep,\
tetra48-imma-fused,tetra48-imma-fused-noprep,tetra48-imma-rps1-fused-noprep
  ;;
imma2)
  matvec matvec-imma2 170 --batches 2,3,4,8 --arms fp16,tetra48-m1-fused-noprep,\
tetra48-imma-fused-noprep
  gpu_tests tests-imma2 250 tests/kernels/test_triton_gpu.py -k "imma" tests/serve/test_gpu.py \
    tests/nn/test_linear.py
  ;;
imma3)
  gpu_tests tests-imma3 150 tests/kernels/test_triton_gpu.py -k "imma"
  matvec matvec-imma3 420 --batches 3,8 --arms fp16,tetra48-imma-fused-noprep,\
tetra48-imma-ksum-fused-noprep,planes14-m1-fused,planes14-imma-fused-noprep
  gpu_tests tests-imma3-serve 210 tests/nn/test_linear.py::test_cuda_forward_compiles_fullgraph \
    tests/serve/test_gpu.py
  ;;
rotrec)
  gpu_tests tests-serve 150 tests/nn/test_linear.py::test_cuda_forward_compiles_fullgraph \
    tests/serve/test_gpu.py
  LEECHQ_ROT_RECORDS=0 gpu_tests tests-serve-norotrec 120 tests/serve/test_gpu.py -k fused
  e2e e2e-8b-rotrec 280 --models qwen3-8b --arms fp16,tetra48,tetra48-norotrec --batches 4,8 \
    --skip-gates --no-profile --budget-s 250
  ;;
imma16)
  gpu_tests tests-imma16 220 tests/kernels/test_triton_gpu.py -k "imma"
  gpu_tests tests-records16 60 tests/kernels/test_triton_norm_rotate.py -k records
  matvec matvec-imma16 170 --batches 8,16 --arms fp16,tetra48-imma-fused-noprep,\
planes14-imma-fused-noprep
  gpu_tests tests-serve16 90 tests/serve/test_gpu.py -k fused
  e2e e2e-8b-imma16 120 --models qwen3-8b --arms fp16,tetra48 --batches 12,16 --skip-gates \
    --no-profile --budget-s 100
  ;;
dense)
  gpu_tests tests-serve-j 200 tests/serve/test_gpu.py -k "fused or decode"
  e2e e2e-8b-dense 330 --models qwen3-8b --arms fp16,tetra48,tetra48-dense129 --batches 1,9,32,64 \
    --skip-gates --no-profile --budget-s 300
  ;;
final)
  gpu_tests tests-serve-final 200 tests/serve/test_gpu.py
  e2e e2e-8b-final 260 --models qwen3-8b --arms fp16,tetra48,ball --batches 16,32,64 \
    --skip-gates --no-profile --budget-s 240
  ;;
mid)
  e2e e2e-8b-mid 400 --models qwen3-8b --arms fp16,tetra48,tetra48-mma --batches 9,12,16 \
    --skip-gates --no-profile --budget-s 360
  ;;
p14dense)
  gpu_tests tests-p14dense 150 tests/kernels/test_triton_gpu.py -k "planes14_dense or planes14_dequant"
  gpu_tests tests-serve 200 tests/serve/test_gpu.py
  e2e e2e-8b-ball 300 --models qwen3-8b --arms fp16,ball --batches 1,8 --skip-gates \
    --no-profile --budget-s 260
  ;;
p14rows)
  matvec matvec-planes14-rows 400 --batches 2,4,8 --arms fp16,planes14-fused,planes14-m1-fused
  ;;
preops)
  gpu_tests tests-preops 170 tests/nn/test_linear.py::test_cuda_forward_compiles_fullgraph \
    tests/kernels/test_triton_norm_rotate.py tests/serve/test_gpu.py
  matvec matvec-preops 150 --batches 1,2 --arms fp16,served,rotation,norms,norm-rotation
  e2e e2e-8b-preops 250 --models qwen3-8b --arms fp16,tetra48,tetra48-unfused --batches 1 \
    --skip-gates --no-profile --budget-s 220
  ;;
e2esmall)
  e2e e2e-8b-small 400 --models qwen3-8b --arms fp16,tetra48 --batches 2,4,8 --skip-gates \
    --no-profile --budget-s 330
  ;;
dequant)
  gpu_tests tests-dequant 200 tests/kernels/test_triton_gpu.py -k "dense_path or dequant"
  timeout 280 python benchmarks/bench_dequant.py --out "$OUT/dequant.json" 2>&1 \
    | tee "$OUT/dequant.log" | grep -v '^{' | tail -60
  gpu_tests tests-imma 100 tests/kernels/test_triton_gpu.py -k imma
  ;;
densek)
  gpu_tests tests-serve-k 200 tests/serve/test_gpu.py
  e2e e2e-8b-densek 380 --models qwen3-8b --arms fp16,tetra48,tetra48-dense9 --batches 1,16,32,64 \
    --skip-gates --no-profile --budget-s 350
  ;;
densekb)
  e2e e2e-8b-densekb 380 --models qwen3-8b --arms ball,ball-dense9 --batches 1,16,64 \
    --skip-gates --no-profile --budget-s 350
  ;;
densek2)
  timeout 150 python benchmarks/bench_dequant.py --forms "" --rows 16,32,64,256 \
    --out "$OUT/dequant-dense.json" 2>&1 | tee "$OUT/dequant-dense.log" | grep -v '^{' | tail -30
  gpu_tests tests-dense2 150 tests/kernels/test_triton_gpu.py -k "dense_path"
  gpu_tests tests-serve-k2 200 tests/serve/test_gpu.py
  e2e e2e-8b-densek2 330 --models qwen3-8b --arms fp16,tetra48,ball --batches 1,16,17,32,64 \
    --skip-gates --no-profile --budget-s 300
  ;;
densek3)
  gpu_tests tests-dense3 150 tests/kernels/test_triton_gpu.py -k "dense_path or dequant or no_local"
  gpu_tests tests-serve-k3 200 tests/serve/test_gpu.py tests/nn/test_linear.py::test_cuda_forward_compiles_fullgraph
  e2e e2e-8b-densek3 200 --models qwen3-8b --arms tetra48,tetra48-dense129 --batches 20,24 \
    --skip-gates --no-profile --budget-s 180
  ;;
densek14)
  gpu_tests tests-dense4 100 tests/kernels/test_triton_gpu.py -k "dense_path or dequant_compiles"
  e2e e2e-14b-densek 230 --models qwen3-14b --arms fp16,tetra48 --batches 1,32 \
    --skip-gates --no-profile --budget-s 210
  ;;
densek5)
  gpu_tests tests-serve-k5 110 tests/serve/test_gpu.py -k "pre_ops or ball_model or fused_logits"
  e2e e2e-8b-densek5 120 --models qwen3-8b --arms tetra48 --batches 32,64 \
    --skip-gates --no-profile --budget-s 100
  ;;
pendingk)
  gpu_tests tests-rot-k 120 tests/kernels/test_triton_norm_rotate.py -k "dense_order or full_widths"
  gpu_tests tests-dense-k 100 tests/kernels/test_triton_gpu.py -k "dense_path or dequant"
  gpu_tests tests-serve-k 200 tests/serve/test_gpu.py tests/nn/test_linear.py::test_cuda_forward_compiles_fullgraph
  e2e e2e-8b-pendingk 260 --models qwen3-8b --arms fp16,tetra48,ball --batches 16,32,64 \
    --skip-gates --no-profile --budget-s 240
  ;;
pdl)
  gpu_tests tests-pdl-kernels 150 tests/kernels/test_triton_gpu.py -k "m1_full or m1_many or rotation_widths"
  gpu_tests tests-pdl-serve 150 tests/serve/test_gpu.py
  matvec matvec-pdl 120 --batches 1 --arms fp16,tetra48-m1-fused-noprep,served
  LEECHQ_PDL=0 matvec matvec-nopdl 120 --batches 1 --arms fp16,tetra48-m1-fused-noprep,served
  ;;
pdl2)
  gpu_tests tests-pdl2-kernels 280 tests/kernels/test_triton_gpu.py \
    -k "planes14_m1 or m1_many or rotation_widths or imma_full or imma_helpers"
  e2e e2e-8b-pdl2 240 --models qwen3-8b --arms fp16,tetra48,tetra48-nopdl --batches 4,8,16 \
    --skip-gates --no-profile --budget-s 220
  gpu_tests tests-pdl2-serve 90 tests/serve/test_gpu.py::test_fused_graph_tokens_equal_eager_tokens \
    tests/serve/test_gpu.py::test_fused_ball_model_matches_reference
  ;;
pdl3)
  e2e e2e-8b-pdl3 200 --models qwen3-8b --arms fp16,tetra48,tetra48-nopdl --batches 1,4,8 \
    --skip-gates --no-profile --budget-s 180
  ;;
pdl4)
  e2e e2e-8b-pdl4 170 --models qwen3-8b --arms fp16,tetra48,tetra48-nopdl --batches 1,2,4 \
    --skip-gates --no-profile --budget-s 150
  ;;
pdlnext)
  gpu_tests tests-pdlnext 200 tests/kernels/test_triton_gpu.py \
    -k "m1_full_shapes and 24 or planes14_m1_many or rotation_widths or no_local"
  e2e e2e-14b-pdl 200 --models qwen3-14b --arms fp16,tetra48,tetra48-nopdl --batches 1 \
    --skip-gates --no-profile --budget-s 180
  matvec matvec-pdl-sweep 180 --batches 1 --sweep --arms fp16,tetra48-m1-fused-noprep,served
  ;;
limbs)
  gpu_tests tests-limbs 200 tests/kernels/test_m1_limbs.py
  gpu_tests tests-serve 200 tests/serve/test_gpu.py
  matvec matvec-limbs 180 --batches 1 --arms fp16,tetra48-m1-fused-noprep,\
tetra48-m1-fused-noprep-limbs,served,served-limbs,rotation-s8,rotation-limbs-s8,rotation-limbs-s16
  ;;
limbse2e)
  e2e e2e-8b-limbs 540 --models qwen3-8b --arms fp16,tetra48,tetra48-limbs,ball,ball-limbs \
    --batches 1,2 --skip-gates --no-profile --budget-s 500
  ;;
rotorder)
  gpu_tests tests-rotorder-nr 150 tests/kernels/test_triton_norm_rotate.py
  gpu_tests tests-rotorder 240 tests/kernels/test_triton_gpu.py tests/kernels/test_m1_limbs.py \
    -k "rotation or limbs"
  e2e e2e-8b-rotorder 170 --models qwen3-8b --arms fp16,tetra48,ball --batches 1 --skip-gates \
    --no-profile --budget-s 150
  ;;
pendingm)
  gpu_tests tests-pendingm 200 tests/kernels/test_triton_norm_rotate.py -k "records"
  gpu_tests tests-serve 200 tests/serve/test_gpu.py
  e2e e2e-8b-pendingm 190 --models qwen3-8b --arms fp16,tetra48,tetra48-norotrec \
    --batches 2,4,8 --skip-gates --no-profile --budget-s 170
  ;;
a16)
  gpu_tests tests-serve-a16 170 tests/serve/test_gpu.py
  e2e e2e-8b-a16 380 --models qwen3-8b --arms fp16,tetra48,tetra48-a24 --batches 1,4,8 \
    --skip-gates --no-profile --budget-s 360
  ;;
a16b)
  gpu_tests tests-a16b 150 tests/kernels/test_a16.py tests/kernels/test_triton_gpu.py \
    -k "a16 or m1_full or imma_full"
  matvec matvec-a16-b2 170 --batches 2 --arms fp16,tetra48-m1-fused-noprep,tetra48-m1-fused-noprep-a24
  e2e e2e-8b-a16b 230 --models qwen3-8b --arms fp16,ball,ball-a24,tetra48 --batches 1,2 \
    --skip-gates --no-profile --budget-s 210
  ;;
e2eprof)
  e2e e2e-8b-prof 300 --models qwen3-8b --arms fp16,tetra48 --batches 1,8 --skip-gates \
    --budget-s 280
  ;;
caps)
  matvec matvec-caps 300 --batches 1 --arms fp16,tetra48-m1-fused-noprep,\
tetra48-m1-fused-noprep-cap80r5,tetra48-m1-fused-noprep-cap80r6,tetra48-m1-fused-noprep-cap72r6,\
served,served-cap80r6
  matvec matvec-caps2 200 --batches 2 --arms fp16,tetra48-m1-fused-noprep,\
tetra48-m1-fused-noprep-r2x4,tetra48-m1-fused-noprep-r2x5
  matvec matvec-rps4 150 --batches 4,8 --arms fp16,tetra48-imma-fused-noprep,\
tetra48-imma-rps4-fused-noprep
  ;;
korder)
  gpu_tests tests-korder 200 tests/kernels/test_korder.py
  matvec matvec-korder 380 --batches 1,2 --arms fp16,tetra48-m1-fused-noprep,\
tetra48-m1-fused-noprep-korder,served,served-korder
  matvec matvec-korder8 150 --batches 8 --arms fp16,tetra48-imma-fused-noprep,\
tetra48-imma-fused-noprep-korder
  ;;
kordere2e)
  e2e e2e-8b-korder 300 --models qwen3-8b --arms fp16,tetra48,tetra48-korder --batches 1,8 \
    --skip-gates --no-profile --budget-s 280
  ;;
t64)
  gpu_tests tests-t64 200 tests/kernels/test_tetra64.py tests/serve/test_gpu.py -k "tetra64 or fused"
  matvec matvec-t64 200 --batches 1 --arms fp16,tetra48-m1-fused-noprep,\
tetra48-m1-fused-noprep-t64,served,served-t64
  ;;
pbits)
  gpu_tests tests-pbits 150 tests/kernels/test_tetra64_bits.py
  matvec matvec-pbits 400 --batches 1 --arms fp16,tetra48-m1-fused-noprep-t64,\
tetra48-m1-fused-noprep-t64-pb16,tetra48-m1-fused-noprep-t64-pb32,\
tetra48-m1-fused-noprep-t64-pb16-xs,tetra48-m1-fused-noprep-t64-pb16-xs-r6,\
null-m1-fused-noprep-t64geo,planes14-m1-fused
  ;;
geo)
  matvec matvec-geo 400 --batches 1 --arms fp16,tetra48-m1-fused-noprep-t64,\
tetra48-m1-fused-noprep-t64-pb16,tetra48-m1-fused-noprep-t64-pb8,\
tetra48-m1-fused-noprep-t64-nw8,tetra48-m1-fused-noprep-t64-pb16-nw8,\
tetra48-m1-fused-noprep-t64-pb8-nw8,tetra48-m1-fused-noprep-t64-pb16-nw16,\
tetra48-m1-fused-noprep-t64-pb8-nw16,served-t64,served-t64-pb8-nw8,served-t64-pb16-nw16,\
planes14-m1-fused,planes14-m1-fused-wide-nw8,planes14-m1-fused-wide-nw16
  gpu_tests tests-geo 120 tests/kernels/test_tetra64_bits.py -k full_shapes
  ;;
pb8)
  gpu_tests tests-pb8 330 tests/kernels/test_tetra64.py tests/kernels/test_tetra64_bits.py \
    tests/serve/test_gpu.py -k "tetra64 or bits or fused"
  e2e_b1 e2e-8b-pb8 240 qwen3-8b tetra48-pb0 200
  ;;
pb8e2e)
  e2e_b1 e2e-14b-pb8 300 qwen3-14b tetra48-pb0 260
  ;;
prefetch)
  gpu_tests tests-prefetch 120 tests/kernels/test_m1_prefetch.py
  matvec matvec-prefetch 420 --batches 1 --arms fp16,tetra48-m1-fused-noprep-t64,\
tetra48-m1-fused-noprep-t64-pf,served-t64,served-t64-pf,planes14-m1-fused,planes14-m1-fused-pf
  ;;
peel)
  gpu_tests tests-peel 120 tests/kernels/test_tetra64_peel.py
  matvec matvec-peel 420 --batches 1 --arms fp16,tetra48-m1-fused-noprep-t64,\
tetra48-m1-fused-noprep-t64-peel,served-t64,served-t64-peel,tetra48-m1-fused-noprep-t64-nopeel,\
tetra48-m1-fused-noprep-t64-peel-r6
  ;;
wait)
  for w in 0 1; do
    LEECHQ_M1_WAIT=$w gpu_tests tests-wait$w 100 tests/kernels/test_tetra64_bits.py -k full_shapes
  done
  python - <<'PY' 2>&1 | grep -v -i warn
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_m1 import m1_kernel
for extra in ({}, {"WAIT": 1}, {"WAIT": 0}, {"PEEL": True}, {"PF": True}):
    ce = dict(N_BLOCKS=170, TAIL_COLS=16, ROWS=112, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1,
              A16=True, CODE=3, PDL=True, PBITS=8, **extra)
    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, ce, num_warps=4,
                      aligned_ints=("d_out", "stride_x", "stride_y", "stride_l"))
    print("registers (Triton here)", extra, I.resource_usage(c),
          I.hot_loop_mix(I.sass(c))["loop_total"])
PY
  matvec matvec-wait 420 --batches 1 --arms fp16,tetra48-m1-fused-noprep-t64,\
tetra48-m1-fused-noprep-t64-w1,tetra48-m1-fused-noprep-t64-w0,served-t64,served-t64-w1,\
served-t64-w0,null-m1-fused-noprep-t64geo
  ;;
split)
  matvec matvec-split 240 --batches 1 --arms fp16,tetra48-m1-fused-noprep-t64,\
tetra48-m1-fused-noprep-t64-nosplit,served-t64,served-t64-nosplit
  gpu_tests tests-split 300 tests/kernels/test_tetra64_bits.py tests/kernels/test_tetra64.py \
    tests/serve/test_gpu.py -k "full_shapes or tetra64 or fused"
  ;;
splite2e)
  e2e_b1 e2e-8b-split 280 qwen3-8b tetra48-nosplit 240
  ;;
split14b)
  e2e_b1 e2e-14b-split 290 qwen3-14b tetra48-nosplit 250
  ;;
t64sweep)
  matvec matvec-t64-sweep 420 --batches 1 --sweep --sweep-t64 --arms fp16,\
tetra48-m1-fused-noprep-t64,served-t64
  ;;
t64e2e)
  e2e e2e-8b-t64 300 --models qwen3-8b --arms fp16,tetra48,tetra48-std --batches 1,2,8 \
    --skip-gates --no-profile --budget-s 280
  e2e e2e-14b-t64 220 --models qwen3-14b --arms fp16,tetra48 --batches 1 --skip-gates \
    --no-profile --budget-s 200
  ;;
breakdown)
  timeout 520 python benchmarks/step_breakdown.py --model qwen3-8b --arms fp16,tetra48 \
    --prompt-lens 32,512 > "$OUT/breakdown.log" 2>&1
  grep -v '^{"bench' "$OUT/breakdown.log" | cut -c1-200 | tail -80
  ;;
attn)
  gpu_tests tests-attn 280 tests/kernels/test_decode_attention.py tests/serve/test_gpu.py
  timeout 200 python benchmarks/step_breakdown.py --model qwen3-8b --arms \
    fp16,tetra48,tetra48-sdpa --prompt-lens 32,512 --seq-len 1024 > "$OUT/breakdown-attn.log" 2>&1
  grep -v '^{"bench' "$OUT/breakdown-attn.log" | grep -v Warn | cut -c1-200 | tail -40
  ;;
attne2e)
  e2e e2e-8b-attn 330 --models qwen3-8b --arms fp16,fp16-sdpa,tetra48,tetra48-sdpa \
    --batches 1 --skip-gates --no-profile --budget-s 300
  e2e e2e-8b-attn4k 230 --models qwen3-8b --arms fp16,tetra48,tetra48-sdpa \
    --batches 1 --skip-gates --no-profile --budget-s 200 --seq-len 4096
  ;;
epilogue)
  gpu_tests tests-epilogue 200 tests/kernels/test_triton_gpu.py -k "dense_path or dense_products"
  timeout 150 python benchmarks/step_breakdown.py --model qwen3-8b --arms tetra48,ball \
    --no-decode --prompt-lens 32,512 > "$OUT/breakdown-epilogue.log" 2>&1
  grep -v '^{"bench' "$OUT/breakdown-epilogue.log" | grep -v "host\|Warn\|warn" | tail -40
  e2e e2e-14b-attn 220 --models qwen3-14b --arms fp16,tetra48 --batches 1 --skip-gates \
    --no-profile --budget-s 190
  ;;
attnw)
  gpu_tests tests-attnw 280 tests/kernels/test_decode_attention.py tests/serve/test_gpu.py
  timeout 120 python benchmarks/step_breakdown.py --model qwen3-8b --arms fp16,tetra48 \
    --no-prefill --seq-len 1024 > "$OUT/breakdown-attnw.log" 2>&1
  grep -v '^{"bench' "$OUT/breakdown-attnw.log" | grep -v "Warn\|warn" | tail -20
  e2e e2e-8b-attnw 130 --models qwen3-8b --arms fp16,tetra48 --batches 1 --skip-gates \
    --no-profile --budget-s 110
  e2e e2e-8b-attnw4k 130 --models qwen3-8b --arms fp16,tetra48 --batches 1 --skip-gates \
    --no-profile --budget-s 110 --seq-len 4096
  ;;
prefillc)
  gpu_tests tests-prefillc 200 tests/serve/test_gpu.py -k "graph or prefill or compiled or greedy"
  timeout 150 python benchmarks/step_breakdown.py --model qwen3-8b --arms fp16,tetra48 \
    --no-decode --prompt-lens 32,512 > "$OUT/breakdown-prefillc.log" 2>&1
  grep -v '^{"bench' "$OUT/breakdown-prefillc.log" | grep -v "host\|Warn\|warn" | tail -40
  ;;
pdle2e)
  e2e e2e-8b-pdl 300 --models qwen3-8b --arms fp16,tetra48,tetra48-nopdl,ball,ball-nopdl \
    --batches 1 --skip-gates --no-profile --budget-s 280
  ;;
*)
  echo "unknown step $step (tests | matvec | sweep | smallm | batched | rotation | e2e | e2esmall | planes14 | pending | p14rows | p14dense | mid | imma16 | dense | final | rotrec | preops | rotsplit | imma | imma2 | imma3 | dequant | densek | densekb | densek2 | densek3 | densek14 | densek5 | pendingk | pdl | pdle2e | pdl2 | pdl3 | pdl4 | pdlnext | limbs | limbse2e | rotorder | pendingm | a16 | a16b | caps | e2eprof | korder | kordere2e | t64 | t64sweep | t64e2e | breakdown | attn | attne2e | epilogue | attnw | prefillc)" >&2
  exit 2
  ;;
esac
