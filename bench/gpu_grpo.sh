#!/bin/bash
# bench/grpo.py's GPU placement on a bare 2-GPU machine with Python 3.12, torch and
# transformers but none of rlfleet's other dependencies and no network (the measured
# 2026-11-26 line in bench/results/grpo.jsonl came from this script).
#
# Wheels, downloaded beforehand on a machine with PyPI into .whl/grpo/ (git-ignored):
#   pip download --python-version 3.12 --only-binary=:all: \
#     --platform manylinux2014_x86_64 --no-deps -d .whl/grpo \
#     pydantic pydantic-core annotated-types typing-inspection typing-extensions fastapi \
#     starlette anyio idna sniffio annotated-doc uvicorn h11 click prometheus-client \
#     pyyaml 'protobuf>=7.35,<8' 'grpcio>=1.85.1' grpcio-health-checking grpcio-reflection
# Then, on the GPU machine, from the repository root, with OUT set to a results folder:
#   bash bench/gpu_grpo.sh [bench/grpo.py arguments]
# With no arguments it measures the default GPU shape (NCCL weights; grpc_stream if NCCL
# fails) and, time allowing, a generation-heavier 16 x 16 shape.
set -u
source bench/gpu_env.sh .whl/grpo || exit 1
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv | tee $OUT/gpus.txt
nvidia-smi topo -m | tee -a $OUT/gpus.txt
python3 -c "import grpc, pydantic, fastapi, uvicorn, torch, transformers; import rlfleet_rollout.service, rlfleet_trainer.run; print('grpc', grpc.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda devices', torch.cuda.device_count())" || exit 1
S=$SECONDS
if [ $# -gt 0 ]; then  # one configuration, given as bench/grpo.py arguments
  timeout -k 10 540 python3 bench/grpo.py --record $OUT "$@" > $OUT/c.log 2>&1 || { grep -v "Loading weights" $OUT/c.log | tail -40; }
  echo "elapsed $((SECONDS-S)) s"; cat $OUT/grpo.jsonl 2>/dev/null; exit 0
fi
WT=nccl
echo "== A: default GPU shape (nccl)"
if ! timeout -k 10 290 python3 bench/grpo.py --record $OUT > $OUT/a.log 2>&1; then
  echo "A failed after $((SECONDS-S)) s:"; grep -v "Loading weights" $OUT/a.log | tail -40
  WT=grpc_stream
  echo "== A2: default GPU shape, grpc_stream"
  timeout -k 10 230 python3 bench/grpo.py --record $OUT --weight-transport grpc_stream > $OUT/a2.log 2>&1 || { grep -v "Loading weights" $OUT/a2.log | tail -30; }
fi
echo "elapsed $((SECONDS-S)) s"
LEFT=$((545-SECONDS+S))
if [ $LEFT -gt 170 ]; then
  echo "== B: 16x16, ~400-token prompts, 64 new tokens (generation-heavier), ${LEFT}s"
  timeout -k 10 $LEFT python3 bench/grpo.py --record $OUT --weight-transport $WT --prompts 16 --generations 16 --prompt-repeats 32 --new-tokens 64 > $OUT/b.log 2>&1 || { grep -v "Loading weights" $OUT/b.log | tail -30; }
fi
echo "elapsed $((SECONDS-S)) s"
cat $OUT/grpo.jsonl 2>/dev/null
