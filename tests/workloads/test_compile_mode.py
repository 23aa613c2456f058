"""torch.compile modes and scopes: parsed, checked, passed to torch.compile, timed as compile_s."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lmscope.cli import main
from lmscope.cli.flags import model_axes
from lmscope.workloads import compile_mode
from lmscope.workloads.step import Spec, run_point
from lmscope.workloads.train_step import TrainStep

TINY = {"size": "tiny", "vocab_size": 67, "d_model": 16, "d_ff": 24, "num_layers": 3, "num_heads": 2,
        "context_length": 9, "batch_size": 2, "device": "cpu"}


class FakeCompile:
    """Stands in for torch.compile: records each call's target and arguments, returns the target."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def __call__(self, target: Any, **options: Any) -> Any:
        self.calls.append((target, options))
        return target


@pytest.fixture
def fake_compile(monkeypatch: pytest.MonkeyPatch) -> FakeCompile:
    fake = FakeCompile()
    monkeypatch.setattr(torch, "compile", fake)
    return fake


@pytest.mark.parametrize(("given", "held"), [("off", False), ("on", True), (True, True), (False, False),
                                              ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs"),
                                              ("Reduce-Overhead", "reduce-overhead")])
def test_a_row_holds_false_true_or_the_modes_name(given: Any, held: Any) -> None:
    assert compile_mode.compile_choice(given) == held


@pytest.mark.parametrize("choice", [True, "max-autotune-no-cudagraphs"])
def test_the_mode_reaches_torch_compile_of_the_whole_model(fake_compile: FakeCompile, choice: Any) -> None:
    step = TrainStep(Spec(**TINY, compile=choice))
    assert step.runnable is step.model and not fake_compile.calls  # nothing compiled before compile_warmup
    seconds = step.compile_warmup()
    ((target, options),) = fake_compile.calls
    assert target is step.model
    assert options == {"mode": None if choice is True else choice, "dynamic": False}
    assert seconds is not None and seconds > 0


def test_scope_blocks_compiles_each_block_with_the_mode(fake_compile: FakeCompile) -> None:
    step = TrainStep(Spec(**TINY, compile="max-autotune-no-cudagraphs", compile_scope="blocks"))
    step.compile_warmup()
    assert step.runnable is step.model
    assert len(fake_compile.calls) == TINY["num_layers"]
    assert [target.__self__ for target, _ in fake_compile.calls] == list(step.model.layers)
    assert all(options["mode"] == "max-autotune-no-cudagraphs" for _, options in fake_compile.calls)


def test_scope_blocks_of_a_model_without_named_blocks_takes_its_largest_module_list() -> None:
    model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2)]),
                                torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]))
    assert list(compile_mode.compiled_blocks(model, None)) == list(model[1])


def test_reduce_overhead_marks_each_step_and_records_in_its_first_two(
        fake_compile: FakeCompile, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graphs need two steps (warm-up, record) inside compile_s, and a step-begin mark per step."""
    monkeypatch.setattr(compile_mode, "check_compile", lambda spec: None)  # the GPU check, on a CPU
    monkeypatch.setattr("lmscope.workloads.model_spec.check_compile", lambda spec: None)
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    step = TrainStep(Spec(**TINY, compile="reduce-overhead"))
    step.compile_warmup()
    assert fake_compile.calls[0][1]["mode"] == "reduce-overhead"
    assert len(marks) == 2
    step()
    assert len(marks) == 3


def test_eager_steps_do_not_mark_cudagraph_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: pytest.fail("marked"))
    TrainStep(Spec(**TINY, compile=False))()


@pytest.mark.parametrize(("fields", "message"), [
    ({"compile": "reduce-overhead", "device": "cpu"}, "need a CUDA GPU: on the CPU use --compile on"),
    ({"compile": "max-autotune"}, "--compile takes off, on, max-autotune-no-cudagraphs, reduce-overhead"),
    ({"compile_scope": "blocks"}, "it needs --compile on"),
    ({"compile": True, "compile_scope": "layers"}, "unknown --compile-scope 'layers'"),
    ({"compile": True, "cuda_graph": "on"}, "torch.compile's own CUDA graphs are --compile reduce-overhead"),
    ({"compile": True, "fast": True, "attention": "flash"}, r"--compile reduce-overhead without --fast"),
])
def test_impossible_compile_choices_are_refused_with_a_fix(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Spec(**{**TINY, **fields})


def test_cli_sweeps_the_modes_and_refuses_reduce_overhead_on_the_cpu(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--size", "tiny", "--device", "cpu", "--compile", "off,on,reduce-overhead"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "reduce-overhead replays CUDA graphs" in err and "Traceback" not in err


def test_the_compile_flag_sweeps_the_modes() -> None:
    axes = model_axes(size="tiny", context_length="9", batch_size="2", precision="fp32", device="cpu",
                      compile="off,on,true,max-autotune-no-cudagraphs,reduce-overhead",
                      compile_scope="blocks")
    assert axes["compile"] == [False, True, "max-autotune-no-cudagraphs", "reduce-overhead"]
    assert axes["compile_scope"] == ["blocks"]


def test_a_compiled_row_carries_compile_s_of_its_first_calls(fake_compile: FakeCompile) -> None:
    one_step = {"warmup": 0, "steps": 1, "target_ci": 0.0}
    row = run_point({**TINY, "compile": "max-autotune-no-cudagraphs", **one_step})
    assert row["compile_s"] > 0 and fake_compile.calls[0][1]["mode"] == "max-autotune-no-cudagraphs"
    assert run_point({**TINY, **one_step})["compile_s"] is None


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_the_hf_peer_compiles_in_every_mode_and_scope(fake_compile: FakeCompile, scope: str) -> None:
    pytest.importorskip("transformers")
    step = TrainStep(Spec(**{**TINY, "vocab_size": 101, "d_model": 36, "d_ff": 52, "num_heads": 3},
                          peer="hf", attention="sdpa", compile="max-autotune-no-cudagraphs",
                          compile_scope=scope))
    step.compile_warmup()
    targets = [target for target, _ in fake_compile.calls]
    if scope == "model":
        assert targets == [step.model]
    else:  # the peer names no blocks: its decoder layers, the largest ModuleList
        assert [t.__self__ for t in targets] == list(step.model.llama.model.layers)
    assert {options["mode"] for _, options in fake_compile.calls} == {"max-autotune-no-cudagraphs"}
