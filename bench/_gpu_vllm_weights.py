"""bench/gpu_vllm.py's weight parts: (2) an in-flight update while 64 streams generate,
(3) trainer -> vLLM weight sync vs a bare broadcast of the same buckets."""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _gpu_vllm_common import (
    CPU_SHAPE,
    Service,
    reference_model,
    service_overrides,
    write_model,
)

BUCKET_BYTES = 256 << 20
"""rlfleet_weights.collective.DEFAULT_BUCKET_BYTES."""

_BARE_RECEIVER = """
import sys, torch
from rlfleet_weights.collective import GroupSpec, WeightGroup
port, sizes, repeats = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
backend = sys.argv[4]
if backend == "nccl":
    torch.cuda.set_device(0)
group = WeightGroup(GroupSpec("127.0.0.1", port, 2, 1, backend, 120.0))
buffers = [torch.zeros(n, dtype=torch.uint8, device=group.device) for n in sizes]
for depth in (1, 2):
    for _ in range(repeats + 1):
        group.broadcast(torch.zeros(1, device=group.device))
        pending = []
        for buf in buffers:
            pending.append(group.pg.broadcast(buf, 0))
            if len(pending) >= depth:
                pending.pop(0).wait()
        for work in pending:
            work.wait()
        if backend == "nccl":
            torch.cuda.synchronize()
group.broadcast(torch.zeros(1, device=group.device))
"""


def _median(values: Any) -> float | None:
    got = [float(v) for v in values]
    return round(statistics.median(got), 2) if got else None


def _sync(gpu: bool) -> None:
    if gpu:
        import torch

        torch.cuda.synchronize()


def _timed_send(group: Any, params: dict[str, Any], gpu: bool) -> float:
    """The sender's side of one update: pack + broadcast every bucket, device-synced."""
    from rlfleet_weights.collective import send_weights

    _sync(gpu)
    t0 = time.perf_counter()
    send_weights(group, params, BUCKET_BYTES)
    _sync(gpu)
    return time.perf_counter() - t0


def _token_logprobs(model: Any, prompt: list[int], tokens: list[int], device: str) -> list[float]:
    import torch

    ids = torch.tensor([prompt + tokens], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(tokens, device=device)[:, None])[:, 0].tolist()


async def inflight(svc: Service, model_dir: Path, dtype: str, gpu: bool) -> dict[str, Any]:
    import torch
    from rlfleet_core.client import connect
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
    from rlfleet_weights.base import WeightPublish
    from rlfleet_weights.collective import CollectiveSender

    device = "cuda:0" if gpu else "cpu"
    if gpu:
        torch.cuda.set_device(0)
    trainer = reference_model(model_dir, dtype, device)
    old = {k: v.detach().clone() for k, v in trainer.state_dict().items()}
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    streams, new_tokens = 64, 900
    prompt = [1, 300, 301, 302, 201, 1, 303, 304, 201]
    async with connect(f"127.0.0.1:{svc.grpc_port}", default_timeout_s=600) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        sender = CollectiveSender(stub, BUCKET_BYTES, "nccl" if gpu else "gloo")
        await sender.init()

        async def stream(i: int) -> list[Any]:
            request = rollout_pb2.GenerateRequest(
                request_id=f"inflight-{i}",
                n=1,
                prompt_token_ids=[*prompt, 3 + i],
                sampling=rollout_pb2.SamplingParams(
                    temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=i
                ),
            )
            return [r async for r in stub.Generate(request)]

        tasks = [asyncio.create_task(stream(i)) for i in range(streams)]
        while True:  # publish once every stream runs (a quarter of their length in)
            status = await stub.GetStatus(rollout_pb2.GetStatusRequest())
            if status.requests_running >= streams or all(t.done() for t in tasks):
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.4 if gpu else 2.0)
        t0 = time.perf_counter()
        reply = await sender.publish(
            WeightPublish(version=1), ((k, p.detach()) for k, p in trainer.named_parameters())
        )
        update_s = time.perf_counter() - t0
        results = await asyncio.gather(*tasks, return_exceptions=True)
        lost = [r for r in results if isinstance(r, BaseException) or len(r) != 1]
        samples = [r[0] for r in results if not isinstance(r, BaseException) and len(r) == 1]
        full = sum(len(s.token_ids) == new_tokens for s in samples)
        spanning = sum(s.weight_version_first == 0 and s.weight_version_last == 1 for s in samples)
        wrong = [
            (s.weight_version_first, s.weight_version_last)
            for s in samples
            if not (s.weight_version_first <= s.weight_version_last <= 1)
        ]
        after = [
            r
            async for r in stub.Generate(
                rollout_pb2.GenerateRequest(
                    request_id="after",
                    prompt_token_ids=prompt,
                    n=8,
                    sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=64, seed=7),
                )
            )
        ]
        await sender.close()
    trainer = trainer.float()
    diffs_new, diffs_old = [], []
    for s in after:
        ref = _token_logprobs(trainer, prompt, list(s.token_ids), device)
        diffs_new += [abs(a - b) for a, b in zip(ref, s.logprobs, strict=True)]
    trainer.load_state_dict({k: v.float() for k, v in old.items()})
    for s in after:
        ref = _token_logprobs(trainer, prompt, list(s.token_ids), device)
        diffs_old += [abs(a - b) for a, b in zip(ref, s.logprobs, strict=True)]
    mean_new, mean_old = statistics.fmean(diffs_new), statistics.fmean(diffs_old)
    versions_after = sorted({(s.weight_version_first, s.weight_version_last) for s in after})
    ok = (
        not lost
        and full == streams
        and not wrong
        and spanning > 0
        and versions_after == [(1, 1)]
        and mean_new < 0.1
        and mean_new * 5 < mean_old
    )
    return {
        "part": "inflight",
        "ok": ok,
        "streams": streams,
        "lost": len(lost),
        "full_length": full,
        "spanning_update": spanning,
        "bad_versions": wrong[:5],
        "first_error": repr(lost[0])[:300] if lost else "",
        "versions_after": versions_after,
        "update_ms": round(update_s * 1e3, 1),
        "service_transfer_ms": round(reply.transfer_time_s * 1e3, 1),
        "service_apply_ms": round(reply.apply_time_s * 1e3, 1),
        "mean_abs_dlogprob_new": round(mean_new, 4),
        "max_abs_dlogprob_new": round(max(diffs_new), 4),
        "mean_abs_dlogprob_old": round(mean_old, 4),
        "logprobs_compared": len(diffs_new),
        "reference": "HF, fp32 compute of the published bf16 weights"
        if dtype == "bfloat16"
        else "HF, same dtype",
    }


def _bare(params: dict[str, Any], plan: Any, repeats: int, gpu: bool, env: dict[str, str]) -> float:
    """Median seconds of the faster schedule (1 or 2 broadcasts in flight) for a bare
    broadcast of the plan's bucket sizes, this process (rank 0) -> a child on GPU 1."""
    import torch
    from rlfleet_core.ports import pick_free_port
    from rlfleet_weights.collective import GroupSpec, WeightGroup

    port = pick_free_port()  # the rendezvous port: both ranks need it in advance
    sizes = [b.nbytes for b in plan.buckets]
    backend = "nccl" if gpu else "gloo"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _BARE_RECEIVER,
            str(port),
            ",".join(map(str, sizes)),
            str(repeats),
            backend,
        ],
        env={**os.environ, **env},
    )
    group = WeightGroup(GroupSpec("127.0.0.1", port, 2, 0, backend, 120.0))
    buffers = [torch.ones(n, dtype=torch.uint8, device=group.device) for n in sizes]
    best = float("inf")
    for depth in (1, 2):
        times = []
        for _ in range(repeats + 1):
            group.broadcast(torch.zeros(1, device=group.device))
            _sync(gpu)
            t0 = time.perf_counter()
            pending = []
            for buf in buffers:
                pending.append(group.pg.broadcast(buf, 0))
                if len(pending) >= depth:
                    pending.pop(0).wait()
            for work in pending:
                work.wait()
            _sync(gpu)
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.median(times[1:]))
    group.broadcast(torch.zeros(1, device=group.device))
    child.wait(timeout=120)
    group.close()
    return best


async def sync(
    work: Path, gpu: bool, env: dict[str, str], repeats: int, names: list[str]
) -> list[dict[str, Any]]:
    import torch
    from rlfleet_core.client import connect
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
    from rlfleet_trainer.model_shapes import LLAMA_1B, SMOLLM2_135M
    from rlfleet_weights.collective import CollectiveSender
    from rlfleet_weights.plan import plan_buckets, specs_of

    shapes = {"smollm2-135m": SMOLLM2_135M, "llama-1b": LLAMA_1B}
    dtype = "bfloat16" if gpu else "float32"
    device = "cuda:0" if gpu else "cpu"
    rows = []
    for name in names:
        shape = shapes[name] if gpu else {**CPU_SHAPE, "tie_word_embeddings": True}
        model_dir = write_model(work / f"sync-{name}" if gpu else work / "cpu-sync", shape, dtype)
        overrides = service_overrides(model_dir, dtype, True, gpu, 8)
        svc = await Service(work, overrides, env, f"sync-{name}").ready()
        try:
            trainer = reference_model(model_dir, dtype, device)
            params = {k: p.detach() for k, p in trainer.named_parameters()}
            plan = plan_buckets(specs_of(params), BUCKET_BYTES)
            async with connect(f"127.0.0.1:{svc.grpc_port}", default_timeout_s=600) as channel:
                stub = rollout_pb2_grpc.RolloutServiceStub(channel)
                sender = CollectiveSender(stub, BUCKET_BYTES, "nccl" if gpu else "gloo")
                await sender.init()
                assert sender.group is not None
                group = sender.group

                updates, spans, transfer, apply = [], [], [], []
                for version in range(1, repeats + 3):  # the first two warm up
                    request = rollout_pb2.UpdateWeightsRequest(
                        weight_version=version,
                        transport=sender.transport,
                        tensors=specs_of(params),
                        bucket_bytes=BUCKET_BYTES,
                    )
                    t0 = time.perf_counter()
                    call = asyncio.ensure_future(stub.UpdateWeights(request, timeout=600.0))
                    span = await asyncio.to_thread(_timed_send, group, params, gpu)
                    reply = await call
                    elapsed = time.perf_counter() - t0
                    if version > 2:
                        updates.append(elapsed)
                        spans.append(span)
                        transfer.append(reply.transfer_time_s)
                        apply.append(reply.apply_time_s)
                await sender.close()
            bare = await asyncio.to_thread(_bare, params, plan, repeats, gpu, env)
        finally:
            svc.stop()
        update, span = statistics.median(updates), statistics.median(spans)
        # The worker logs its receive and reload_weights times (vllm_worker.load_from_group).
        found = re.findall(
            r"received \d+ bytes in ([\d.]+) ms, reload_weights ([\d.]+) ms",
            Path(svc.log.name).read_text(),
        )[2:]  # after the warm-up updates
        rows.append(
            {
                "part": "sync",
                "model": name,
                "bytes": plan.total_bytes,
                "buckets": len(plan.buckets),
                "bucket_mb": BUCKET_BYTES >> 20,
                "update_ms": round(update * 1e3, 2),
                "broadcast_ms": round(span * 1e3, 2),
                "bare_ms": round(bare * 1e3, 2),
                "service_transfer_ms": round(statistics.median(transfer) * 1e3, 2),
                "service_apply_ms": round(statistics.median(apply) * 1e3, 2),
                "worker_receive_ms": _median(a for a, _ in found),
                "worker_reload_ms": _median(b for _, b in found),
                "ratio_update": round(bare / update, 3),
                "ratio_broadcast": round(bare / span, 3),
                "update_runs_ms": [round(u * 1e3, 2) for u in updates],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        trainer = params = None  # free GPU 0 before the next model
        if gpu:
            torch.cuda.empty_cache()
    return rows
