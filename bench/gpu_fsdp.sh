#!/bin/bash
# The torch backend's FSDP2 on two GPUs (NCCL): 2 ranks on half a batch each against one
# process on the whole batch, float32, through services/trainer/tests/fsdp_parity.py (the
# CPU test runs the same probe with gloo). From the repository root on a bare 2-GPU
# machine, with OUT set and the wheels of bench/gpu_grpo.sh's header in .whl/grpo/:
#   bash bench/gpu_fsdp.sh      -> $OUT/fsdp-gpu.jsonl (a line of bench/results/fsdp-gpu.jsonl)
set -u
source bench/gpu_env.sh .whl/grpo || exit 1
M=$(python3 -c "from rlfleet_core.models import resolve_model; print(resolve_model('tiny'))") || exit 1
P=services/trainer/tests/fsdp_parity.py
python3 -m torch.distributed.run --nproc_per_node 2 $P --device cuda --out $OUT $M > $OUT/fsdp.log 2>&1 || { tail -30 $OUT/fsdp.log; exit 1; }
python3 $P --device cuda --plain --out $OUT $M >> $OUT/fsdp.log 2>&1 || { tail -30 $OUT/fsdp.log; exit 1; }
python3 - <<'PY'
import json, os, torch
out = os.environ["OUT"]
a = torch.load(f"{out}/fsdp.pt", weights_only=False); b = torch.load(f"{out}/plain.pt", weights_only=False)
gap = max(float((a["state"][k].float() - v.float()).abs().max()) for k, v in b["state"].items())
line = {"name": "gpu_fsdp2", "device": f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}",
        "what": "torch backend, FSDP2 over 2 ranks (NCCL, each half the batch) vs one process on the whole batch, float32",
        "loss_fsdp": a["loss"], "loss_plain": b["loss"], "grad_norm_fsdp": a["grad_norm"], "grad_norm_plain": b["grad_norm"],
        "weights_max_abs_after_step": gap}
print(json.dumps(line)); open(f"{out}/fsdp-gpu.jsonl", "w").write(json.dumps(line) + "\n")
PY
rm -f $OUT/fsdp.pt $OUT/plain.pt
