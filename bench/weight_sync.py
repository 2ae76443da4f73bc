"""Weight sync into a running rollout service vs a bare torch.distributed broadcast.

Ours: the service (hf engine) runs in its own process; this process is the trainer-side
sender. `InitWeightTransfer` forms a gloo group (TCPStore + ProcessGroupGloo), then each
update is an `UpdateWeights` RPC while `send_weights` packs the state dict into buckets
and broadcasts them; the service receives, copies into the live model and bumps the
version. Latency = wall time of the RPC (transfer + apply), GB/s = bytes / latency.

Baseline, in the same run: a bare `ProcessGroupGloo` between this process and a child
process, broadcasting preallocated buffers of the same bucket sizes (no packing, no RPC,
no load into a model), once with one broadcast in flight and once with two (the schedule
ours uses); the faster is the baseline: the transport's ceiling. Target: >= 0.8x its
throughput. Both sides are separate processes as in ours (same process layout).

Sizes: the tiny test model, a synthetic 4-layer Qwen2 (~100 MB) and SmolLM2-135M
(~540 MB float32; full run only). On GPUs the same code runs with NCCL (transport=nccl).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rlfleet_core.ports import pick_free_port, wait_for_port_file

DESCRIPTION = "weight update latency and GB/s into the rollout service vs a bare gloo broadcast"
BUCKET_BYTES = 1 << 20

_BARE_RECEIVER = """
import sys, time, datetime, torch, torch.distributed as dist
port, world, sizes = int(sys.argv[1]), 2, [int(x) for x in sys.argv[2].split(",")]
repeats, depths = int(sys.argv[3]), [int(x) for x in sys.argv[4].split(",")]
store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=120))
pg = dist.ProcessGroupGloo(dist.PrefixStore("bare", store), 1, world, datetime.timedelta(seconds=120))
pg.broadcast(torch.zeros(1), 0).wait()
buffers = [torch.zeros(n, dtype=torch.uint8) for n in sizes]  # like a model: own memory
for depth in depths:
    for _ in range(repeats + 1):
        pending = []
        for buf in buffers:
            pending.append(pg.broadcast(buf, 0))
            if len(pending) >= depth:
                pending.pop(0).wait()
        for work in pending:
            work.wait()
        pg.broadcast(torch.zeros(1), 0).wait()
"""

DEPTHS = (1, 2)
"""Broadcasts in flight in the baseline: 1 (post, wait, next) and 2 (the double-buffered
schedule `send_weights`/`receive_weights_into` use). The faster of the two is the
baseline, so pipelining alone cannot lift the ratio."""


def _synthetic_model(out: Path) -> Path:
    import torch
    from rlfleet_core.models import build_tiny_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    build_tiny_tokenizer().save_pretrained(out)
    return out


def _bare_gbps(sizes: list[int], repeats: int) -> dict[int, list[float]]:
    """GB/s of a full set of buckets over a bare gloo group, `repeats` times for each
    depth of `DEPTHS` (one preallocated, pre-faulted buffer per bucket on both sides, as
    ours receives into the model's own memory)."""
    import datetime

    import torch
    import torch.distributed as dist

    port = pick_free_port()  # the store's port: the child needs it in advance
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _BARE_RECEIVER,
            str(port),
            ",".join(map(str, sizes)),
            str(repeats),
            ",".join(map(str, DEPTHS)),
        ]
    )
    try:
        timeout = datetime.timedelta(seconds=120)
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, timeout=timeout)
        pg = dist.ProcessGroupGloo(dist.PrefixStore("bare", store), 0, 2, timeout)
        pg.broadcast(torch.zeros(1), 0).wait()
        buffers = [torch.randint(0, 255, (n,), dtype=torch.uint8) for n in sizes]
        out: dict[int, list[float]] = {}
        for depth in DEPTHS:
            rates = []
            for _ in range(repeats + 1):  # the first round warms up (not counted)
                start = time.perf_counter()
                pending = []
                for buf in buffers:
                    pending.append(pg.broadcast(buf, 0))
                    if len(pending) >= depth:
                        pending.pop(0).wait()
                for work in pending:
                    work.wait()
                pg.broadcast(torch.zeros(1), 0).wait()  # the receiver has everything
                rates.append(sum(sizes) / (time.perf_counter() - start) / 1e9)
            out[depth] = rates[1:]
        rc = child.wait(120)
        assert rc == 0, f"bare receiver exited with {rc}"
        return out
    finally:
        child.kill()


def _ours(model_dir: Path, state: dict[str, Any], repeats: int) -> list[float]:
    """GB/s of each UpdateWeights round trip into a service in another process."""
    import grpc
    from rlfleet_core.client import wait_for_serving
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
    from rlfleet_weights.collective import GroupSpec, WeightGroup, send_weights
    from rlfleet_weights.plan import specs_of

    port_file = Path(tempfile.mkdtemp(prefix="bench-weight-sync-")) / "ports.json"
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet_rollout",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "engine=hf",
            f"model={model_dir}",
            "engine_config.max_model_len=256",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import asyncio

        grpc_port = wait_for_port_file(port_file, service, timeout_s=300).grpc
        asyncio.run(wait_for_serving(f"127.0.0.1:{grpc_port}", timeout_s=300))
        channel = grpc.insecure_channel(
            f"127.0.0.1:{grpc_port}", options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        port = pick_free_port()  # the group's rendezvous, named to the service
        box: dict[str, Any] = {}
        joiner = threading.Thread(
            target=lambda: box.update(group=WeightGroup(GroupSpec("127.0.0.1", port, 2, 0)))
        )
        joiner.start()
        stub.InitWeightTransfer(
            rollout_pb2.InitWeightTransferRequest(
                transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
                master_address="127.0.0.1",
                master_port=port,
                world_size=2,
                rank_offset=1,
                timeout_s=120,
            ),
            timeout=180,
        )
        joiner.join()
        group = box["group"]
        specs = specs_of(state)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        rates: list[float] = []
        timings: list[tuple[float, float, float]] = []
        for version in range(1, repeats + 2):  # version 1 warms up (not counted)
            request = rollout_pb2.UpdateWeightsRequest(
                weight_version=version,
                transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
                tensors=specs,
                bucket_bytes=BUCKET_BYTES,
            )
            start = time.perf_counter()
            future = stub.UpdateWeights.future(request, timeout=300)
            send_weights(group, state, BUCKET_BYTES)
            reply = future.result()
            elapsed = time.perf_counter() - start
            rates.append(nbytes / elapsed / 1e9)
            assert reply.weight_version == version
            timings.append((elapsed, reply.transfer_time_s, reply.apply_time_s))
        channel.close()
        group.close()
        if os.environ.get("RLFLEET_BENCH_VERBOSE"):
            print("rpc/transfer/apply s:", timings, file=sys.stderr)
        return rates[1:]
    finally:
        service.terminate()
        service.wait(30)


def _bucket_sizes(state: dict[str, Any]) -> list[int]:
    from rlfleet_weights.plan import plan_buckets, specs_of

    return [b.nbytes for b in plan_buckets(specs_of(state), BUCKET_BYTES).buckets]


def run(quick: bool = False) -> list[Any]:
    import torch
    from rlfleet_core.bench import BenchResult
    from rlfleet_core.models import resolve_model
    from transformers import AutoModelForCausalLM

    # For the service and bare-receiver children. This process imported torch above, so
    # it keeps torch's default intra-op threads, as a trainer would.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    repeats = 2 if quick else 3
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {"tiny": resolve_model("tiny"), "qwen2-4l-512": _synthetic_model(Path(tmp) / "m")}
        if not quick:
            models["smollm2-135m"] = resolve_model("smollm2-135m-instruct")
        for label, path in models.items():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            state = {k: v + 0.001 for k, v in model.state_dict().items()}
            del model
            nbytes = sum(t.numel() * t.element_size() for t in state.values())
            ours = _ours(path, state, repeats)
            bare_by_depth = _bare_gbps(_bucket_sizes(state), repeats)
            medians = {d: statistics.median(r) for d, r in bare_by_depth.items()}
            best = max(medians, key=lambda d: medians[d])
            bare = bare_by_depth[best]
            extra = {
                "model": label,
                "bytes": nbytes,
                "bucket_bytes": BUCKET_BYTES,
                "engine": "hf",
                "transport": "gloo",
                "repeats": repeats,
                "ours_latency_s": round(nbytes / 1e9 / statistics.median(ours), 4),
                "bare_latency_s": round(nbytes / 1e9 / statistics.median(bare), 4),
                "bare_depth": best,
                "bare_gbps_by_depth": {str(d): round(m, 4) for d, m in medians.items()},
                "ours_gbps_all": [round(r, 4) for r in ours],
                "bare_gbps_all": [round(r, 4) for r in bare],
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
            results.append(
                BenchResult(
                    "weight-sync",
                    f"gbps_{label}",
                    statistics.median(ours),
                    "GB/s",
                    statistics.median(bare),
                    target=0.8,
                    extra=extra,
                )
            )
    return results
