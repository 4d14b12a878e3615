#!/bin/bash
# The GPU suites, run on a CUDA host from the repository root; each under 10 minutes, results under
# $OUT (default /tmp/out). Usage: benchmarks/gpu_perf.sh SUITE
#   gputests  the whole GPU test tier in one run (pytest -m gpu, 14 workers, a fallback warning
#             fails the test; carry .whl/ for the serving and checkpoint-conversion tests):
#             each test's outcome, passed / failed and the 20 slowest tests in $OUT/gputests.log
#   gputests-rest  on the same warm machine after a gputests run that its time limit stopped:
#             the GPU tests that run's log has no outcome for, to $OUT/gputests-rest.log
#   kernels   one decode step's projections, Qwen3-8B shapes: at 1 activation row the served
#             Tetra groups against cuBLAS fp16 (benchmarks/bench_matvec.py), at 2..128 rows the
#             served path, the float16 tensor-core GEMM and torch's int4 tinygemm
#             (benchmarks/bench_gemm.py)
#   e2e       decode tokens/s of Qwen3-8B at batch 1, 8, 16, 32 and 64, fp16 against Tetra in one
#             process, correctness gates first (benchmarks/bench_e2e.py)
#   ball      the ball codebook at Qwen3-8B shapes: its served projections and GEMM geometries at
#             4..64 rows (bench_gemm.py --codebook ball), then decode tokens/s at batch 1..64,
#             fp16 / ball / Tetra in one process (BENCHMARKS §1 and §2's ball tables)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
suite=${1:-}

case "$suite" in
gputests|gputests-rest)
  # the pure-Python packages the GPU image lacks (fastapi, uvicorn, openai, gguf, llvq-tetra: the
  # wheels under .whl/, carried) go to a private target, or their tests skip
  if ls .whl/*.whl > /dev/null 2>&1; then
    python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/gpu-site .whl/*.whl > /dev/null 2>&1
    export PYTHONPATH=$PYTHONPATH:/tmp/gpu-site
  fi
  # -v: the log names each test as it ends, so a run stopped by its limit says which did not
  # (kept in /tmp for gputests-rest; $OUT is new each call)
  # two CPU threads a worker: 14 workers at torch's default (every core each) oversubscribe the
  # 16 cores, and the tests' CPU references (encodes, f64 decodes) then set the wall time
  export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
  log=/tmp/$suite.log; tests=()
  if [ "$suite" = gputests-rest ]; then
    [ -f /tmp/gputests.log ] || { echo "no gputests log on this machine"; exit 2; }
    python -m pytest -m gpu --collect-only -q -p no:cacheprovider 2> /dev/null \
      | grep '::' | sort > /tmp/gputests-all.txt
    grep -oE '(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) tests/[^ ]+' /tmp/gputests.log \
      | cut -d' ' -f2 | sort -u > /tmp/gputests-done.txt
    mapfile -t tests < <(comm -23 /tmp/gputests-all.txt /tmp/gputests-done.txt)
    echo "${#tests[@]} of $(wc -l < /tmp/gputests-all.txt) GPU tests have no outcome in the log"
    [ ${#tests[@]} -gt 0 ] || exit 0
  fi
  timeout 560 python -m pytest -m gpu -n 14 --dist worksteal -p no:cacheprovider -p no:benchmark \
    -W error::UserWarning -v --durations=20 "${tests[@]}" > $log 2>&1
  rc=$?
  cp $log "$OUT/"
  grep -E '(FAILED|ERROR) tests/' $log | head -20; tail -30 $log
  exit $rc
  ;;
kernels)
  timeout 200 python benchmarks/bench_matvec.py --model qwen3-8b --rows 1 \
    --out "$OUT/matvec.json" 2>&1 | tee "$OUT/matvec.log" | grep -v '^{"bench'
  timeout 340 python benchmarks/bench_gemm.py --model qwen3-8b --configs 4x2x4 \
    --rows 2,3,4,8,16,32,64,128 --out "$OUT/gemm.json" 2>&1 | tee "$OUT/gemm.log" \
    | grep -v '^{"bench'
  ;;
e2e)
  timeout 560 python benchmarks/bench_e2e.py --models qwen3-8b --arms fp16,tetra48 \
    --batches 1,8,16,32,64 --no-profile --budget-s 500 --out "$OUT/e2e.json" 2>&1 \
    | tee "$OUT/e2e.log" | grep -v '^{"bench'
  ;;
ball)
  timeout 200 python benchmarks/bench_gemm.py --codebook ball --configs 4x2x4,4x1x4 \
    --rows 4,8,12,16,32,64 --out "$OUT/gemm-ball.json" 2>&1 | tee "$OUT/gemm-ball.log" \
    | grep -v '^{"bench'
  timeout 360 python benchmarks/bench_e2e.py --quick --models qwen3-8b --arms fp16,ball,tetra48 \
    --batches 1,8,16,32,64 --skip-gates --no-profile --budget-s 300 --out "$OUT/e2e-ball.json" \
    2>&1 | tee "$OUT/e2e-ball.log" | grep -v '^{"bench'
  ;;
*)
  echo "unknown suite '$suite' (gputests | kernels | e2e | ball)" >&2
  exit 2
  ;;
esac
