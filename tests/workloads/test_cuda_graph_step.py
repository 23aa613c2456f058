"""CUDA-graph replay of the training step: choices checked up front; on a GPU, same math as eager."""

from __future__ import annotations

import pytest
import torch

from lmscope.cli import main
from lmscope.workloads.cuda_graph_step import GraphedStep, uses_cuda_graph
from lmscope.workloads.step import Spec
from lmscope.workloads.train_step import TrainStep


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cuda_graph": "sometimes"}, "unknown --cuda-graph"),
        ({"cuda_graph": "on", "compile": True, "device": "cpu"}, "pick one"),
        ({"cuda_graph": "on", "precision": "fp16", "device": "cpu"}, "GradScaler"),
        ({"cuda_graph": "on", "device": "cpu"}, "needs a CUDA GPU"),
    ],
)
def test_impossible_cuda_graph_choices_are_refused_with_a_fix(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Spec(size="tiny", **fields)


def test_auto_means_graphs_for_the_fast_path_on_a_gpu_only() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    fast = Spec(size="tiny", attention="sdpa", fast=True, device="cpu")
    eager = Spec(size="tiny", attention="sdpa", device="cpu")
    assert uses_cuda_graph(fast, "auto", cuda)
    assert not uses_cuda_graph(fast, "auto", cpu)
    assert not uses_cuda_graph(eager, "auto", cuda)
    assert not uses_cuda_graph(fast, "off", cuda)
    assert uses_cuda_graph(eager, "on", cuda)
    fp16 = Spec(size="tiny", attention="sdpa", fast=True, precision="fp16", device="cpu")
    assert not uses_cuda_graph(fp16, "auto", cuda)


def test_graphed_step_needs_an_eager_warm_up_step() -> None:
    with pytest.raises(ValueError, match="at least 1 eager warm-up"):
        GraphedStep(TrainStep(Spec(size="tiny", device="cpu")), warmup=0)


def test_bench_cli_refuses_cuda_graph_on_the_cpu_in_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--size", "tiny", "--device", "cpu", "--cuda-graph", "on"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "needs a CUDA GPU" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("fast", "attention", "in_backward"),
                         [(False, "sdpa", False), (True, "flash", False), (True, "flash", True)])
def test_graph_replays_train_like_the_eager_step(fast: bool, attention: str, in_backward: bool) -> None:
    """Three eager steps then two replays end with the parameters of five eager steps.

    With in_backward both update the weights inside the backward (a side stream in the capture).
    """
    fields = dict(size="tiny", num_layers=3, context_length=67, batch_size=3, precision="bf16",
                  attention=attention, fast=fast, device="cuda", optimizer_in_backward=in_backward)
    eager = TrainStep(Spec(**fields, cuda_graph="off"), capturable=True)
    for _ in range(5):
        eager()
    spec = Spec(**fields, cuda_graph="on")
    graphed = GraphedStep(TrainStep(spec, capturable=True), warmup=3)
    for _ in range(2):
        graphed()
    torch.cuda.synchronize()
    for (name, want), got in zip(eager.model.named_parameters(), graphed.step.model.parameters(),
                                 strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert graphed.capture_peak_allocated_bytes > 0
