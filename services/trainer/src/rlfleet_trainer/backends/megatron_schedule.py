"""Pipeline parallelism of the megatron backend without Megatron's CUDA-only schedules:
`Pipeline` sends [L, N, H] activations and their gradients to the neighbouring stages with
`batch_isend_irecv` (gloo and NCCL alike), `one_forward_one_backward` runs a small 1F1B
schedule over the micro-batches of a training step.

Shape legend: N = samples, L = sequence length, H = hidden size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rlfleet_trainer.batch import TrainBatch


class Pipeline:
    """This rank's pipeline stage: where it sits, its neighbours, and the exchange of
    activations [L, N, H] (forward) and their gradients (backward) with them.

    Each exchange posts all of its sends and receives in one `batch_isend_irecv` and waits for
    all of them, so two neighbours that send to each other in the same step (1F1B's steady
    state) cannot deadlock. Activations travel as float32 whatever the autocast dtype."""

    def __init__(self, ps: Any, hidden_size: int, device: torch.device) -> None:
        self.rank = ps.get_pipeline_model_parallel_rank()
        self.size = ps.get_pipeline_model_parallel_world_size()
        self.group = ps.get_pipeline_model_parallel_group()
        self.is_first = self.rank == 0
        self.is_last = self.rank == self.size - 1
        self.prev = None if self.is_first else ps.get_pipeline_model_parallel_prev_rank()
        self.next = None if self.is_last else ps.get_pipeline_model_parallel_next_rank()
        self.last_rank = ps.get_pipeline_model_parallel_last_rank()
        self.hidden_size = hidden_size
        self.device = device

    def shape(self, batch: TrainBatch) -> tuple[int, int, int]:
        """The activation one micro-batch sends between stages (sequence-first)."""
        num, length = batch.input_ids_NL.shape
        return (length, num, self.hidden_size)

    def exchange(
        self,
        *,
        send_next: torch.Tensor | None = None,
        send_prev: torch.Tensor | None = None,
        recv_prev: tuple[int, ...] | None = None,
        recv_next: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Send to / receive from the neighbours (a missing neighbour makes that part a
        no-op); returns (from prev, from next)."""
        ops, got_prev, got_next = [], None, None
        if recv_prev is not None and self.prev is not None:
            got_prev = torch.empty(recv_prev, dtype=torch.float32, device=self.device)
            ops.append(dist.P2POp(dist.irecv, got_prev, self.prev))
        if recv_next is not None and self.next is not None:
            got_next = torch.empty(recv_next, dtype=torch.float32, device=self.device)
            ops.append(dist.P2POp(dist.irecv, got_next, self.next))
        if send_next is not None and self.next is not None:
            ops.append(dist.P2POp(dist.isend, _wire(send_next), self.next))
        if send_prev is not None and self.prev is not None:
            ops.append(dist.P2POp(dist.isend, _wire(send_prev), self.prev))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return got_prev, got_next

    def from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """The last stage's value of `tensor` on every stage (same shape everywhere)."""
        if self.size == 1:
            return tensor
        on_device = tensor.to(self.device)
        dist.broadcast(on_device, src=self.last_rank, group=self.group)
        return on_device.to(tensor.device)

    def objects_from_last_stage(self, value: Any) -> Any:
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self.last_rank, group=self.group)
        return box[0]


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().float().contiguous()


def one_forward_one_backward(
    pipe: Pipeline,
    parts: list[TrainBatch],
    stage_forward: Callable[[TrainBatch, torch.Tensor | None], torch.Tensor],
) -> None:
    """Gradients of every micro-batch, accumulated in `.grad`, by a 1F1B schedule.

    `stage_forward(part, input_LNH)` is this stage's forward (the loss on the last stage;
    `input_LNH` is the previous stage's output, None on the first). Stage r first runs
    `size − r − 1` forwards (the pipeline fills), then alternates one forward and one
    backward, then drains the remaining backwards; so a stage holds the activations of at
    most `size − r` micro-batches. With one stage this is plain forward/backward per
    micro-batch."""
    pending: deque[tuple[torch.Tensor | None, torch.Tensor]] = deque()

    def forward(i: int, input_LNH: torch.Tensor | None) -> torch.Tensor:
        if input_LNH is not None:
            input_LNH.requires_grad_(True)  # its .grad is what we send back
        out = stage_forward(parts[i], input_LNH)
        pending.append((input_LNH, out))
        return out

    def backward(grad_out: torch.Tensor | None) -> torch.Tensor | None:
        input_LNH, out = pending.popleft()
        if grad_out is not None:
            grad_out = grad_out.to(out.dtype)
        torch.autograd.backward(out, grad_tensors=grad_out)
        return None if input_LNH is None else input_LNH.grad

    num = len(parts)
    warmup = min(pipe.size - pipe.rank - 1, num)
    for i in range(warmup):
        input_LNH, _ = pipe.exchange(recv_prev=pipe.shape(parts[i]))
        pipe.exchange(send_next=forward(i, input_LNH))
    input_LNH = None
    if warmup < num:
        input_LNH, _ = pipe.exchange(recv_prev=pipe.shape(parts[warmup]))
    for k in range(num - warmup):  # steady state: forward i, backward k
        i = warmup + k
        out = forward(i, input_LNH)
        _, grad_out = pipe.exchange(send_next=out, recv_next=pipe.shape(parts[k]))
        grad_in = backward(grad_out)
        more = i + 1 < num
        input_LNH, _ = pipe.exchange(
            send_prev=grad_in, recv_prev=pipe.shape(parts[i + 1]) if more else None
        )
    for k in range(num - warmup, num):  # cool-down
        _, grad_out = pipe.exchange(recv_next=pipe.shape(parts[k]))
        pipe.exchange(send_prev=backward(grad_out))
