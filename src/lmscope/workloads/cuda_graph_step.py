"""A training step replayed from CUDA graphs: the same kernels, none of the host's launch work.

Small and medium models, and every model on a slow host, spend the step waiting for the CPU to
launch kernels (see the bench results: xl's eager bf16 step varies by tens of ms with the host).
`GraphedStep` runs a `TrainStep` eagerly a few times (autotuning, lazy initialisation, optimizer
state), then captures each of its phases -- forward (with the loss), backward, optimizer -- as one
CUDA graph in a shared memory pool, and from then on replays them in the same order. Phase
boundaries stay visible to the timer because each phase is its own graph.

Gradients: they are cleared before capture, so the backward graph allocates them from the pool
and every replay writes them afresh (no accumulation across steps), as ``zero_grad(set_to_none)``
does for the eager step. The batch is the step's fixed random batch, as in the eager step.

Limits: CUDA only; not with torch.compile (its own CUDA graphs are ``--compile reduce-overhead``) and not with
fp16's GradScaler, whose inf check reads a value on the host. Python-side values (the learning
rate, hyper-parameters) are fixed at capture.
"""

from __future__ import annotations

import torch

from lmscope.inputs.choices import check_choices
from lmscope.measure.timer import PhaseClock
from lmscope.workloads.model_spec import ModelPointSpec
from lmscope.workloads.train_step import TrainStep

EAGER_WARMUP_STEPS = 3
"""Eager steps before capture: autotune the Triton kernels and create the optimizer state."""


def check_cuda_graph_choice(spec: ModelPointSpec, choice: str) -> None:
    """Refuse --cuda-graph values that cannot work for this point, saying what to change."""
    check_choices({"cuda_graph": choice})
    if choice != "on":
        return
    if spec.compile:
        raise ValueError("--cuda-graph on with --compile: pick one (torch.compile's own CUDA graphs "
                         "are --compile reduce-overhead)")
    if spec.precision == "fp16":
        raise ValueError("--cuda-graph on cannot capture fp16's GradScaler (it reads an inf check on "
                         "the host): use --precision bf16 or --cuda-graph off")
    if spec.device == "cpu" or (spec.device == "auto" and not torch.cuda.is_available()):
        raise ValueError("--cuda-graph on needs a CUDA GPU: use --cuda-graph off (or auto) on the CPU")


def uses_cuda_graph(spec: ModelPointSpec, choice: str, device: torch.device) -> bool:
    """Whether the point runs from CUDA graphs: on; or auto for the fast path on a GPU."""
    if choice == "on":
        return True
    return (choice == "auto" and spec.fast and device.type == "cuda" and not spec.compile
            and spec.precision != "fp16")


class GraphedStep:
    """Calls like a `TrainStep` (``step(clock)``), but replays its phases from CUDA graphs."""

    def __init__(self, step: TrainStep, warmup: int = EAGER_WARMUP_STEPS) -> None:
        if warmup < 1:  # the optimizer state must exist before capture, or replays re-zero it
            raise ValueError(f"GraphedStep needs at least 1 eager warm-up step, got {warmup}")
        if step.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.step = step
        self.device = step.device
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # PyTorch's rule: warm up on a side stream before capture
            for _ in range(warmup):
                step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        if step.spec.mode != "forward":
            step.model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()  # the eager steps' cached blocks; the graphs get their own pool
        torch.cuda.reset_peak_memory_stats(self.device)
        pool = torch.cuda.graph_pool_handle()
        self.graphs: list[tuple[str, torch.cuda.CUDAGraph]] = []
        for name, run in step.phases():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                run()
            self.graphs.append((name, graph))
        torch.cuda.synchronize(self.device)
        self.capture_peak_allocated_bytes = torch.cuda.max_memory_allocated(self.device)
        """The step's true peak: replays allocate nothing, so later peaks miss the activations. The
        allocator's process-wide count: subtract what the process held before the point."""

    def __call__(self, clock: PhaseClock | None = None) -> None:
        """One step: replay the phases' graphs in capture order, marking each on `clock`."""
        if clock is not None:
            clock.start()
        for name, graph in self.graphs:
            graph.replay()
            if clock is not None:
                clock.mark(name)
