"""`lmscope plan`: the XXL worked example, plan sections from accounting, rendering and the CLI."""

import json
import math

import pytest

from lmscope.accounting.flops import parameter_counts, step_flops
from lmscope.accounting.parallelism import Hardware, Mesh, PrecisionPlan, compute_bound_tokens
from lmscope.accounting.xxl import FFNStack, ffn_model, worked_example
from lmscope.cli import main
from lmscope.config import preset
from lmscope.planning.plan import comm_plan, flops_plan, mfu_record, model_shape, parallel_plan, render_plan

V5P = Hardware(name="v5p", peak_flops=4.6e14, axis_bandwidth=1.8e11, memory_bytes=95e9)


def results(model=None):
    return {s.quantity: s for s in worked_example(model or ffn_model("xxl"))}


def test_xxl_figures():
    xxl = ffn_model("xxl")
    assert xxl.parameters == 219_848_638_464
    steps = results()
    assert steps["bytes per parameter (fp32 master + gradient + AdamW m, v)"].value == 16
    state = steps["master weights + accumulated gradients + optimizer state"]
    assert round(state.value, 2) == 3517.58 and state.result == "3,517.58 GB"
    assert math.ceil(steps["80 GB GPUs worth of that memory"].value) == 44
    assert steps["bf16 activations saved for backward, per token"].value == 2 * 126 * (16384 + 53248)
    assert steps["N_FSDP to fit 95 GB with the activations of 0 tokens"].value == 38  # 3517.58 / 95 = 37.03
    assert steps["N_FSDP to fit 95 GB with the activations of 4,096 tokens"].value == 61
    batch = steps["compute-bound global batch B"].value
    assert batch == pytest.approx(25_301.7, abs=0.1)
    per_device = steps["compute-bound per-device batch, X=16 FSDP x Y=4 TP"]
    assert per_device.value == pytest.approx(395.34, abs=0.01)
    floor = [s for q, s in steps.items() if q.startswith("Book's floor")][0]
    assert floor.value == pytest.approx(245.30, abs=0.01)  # 2 * 2555.6^2 / 53248


def test_xxl_closed_form_agrees_with_the_general_planner():
    xxl = ffn_model("xxl")
    mesh = Mesh(fsdp=16, tp=4, fsdp_axes=2, tp_axes=1)
    solved = compute_bound_tokens(xxl.shape(), mesh, PrecisionPlan(), V5P, ring_factors=False)
    assert solved == pytest.approx(results()["compute-bound global batch B"].value, rel=1e-9)


def test_ffn_stack_by_hand():
    small = FFNStack(name="s", d_model=3, d_ff=5, num_blocks=2)
    assert small.parameters == 60 and small.activation_elements_per_token == 16
    assert small.shape().forward_flops_per_token == 120
    # no activations: 16 * 60 bytes on a 95 GB device -> 1 shard
    assert results(small)["N_FSDP to fit 95 GB with the activations of 0 tokens"].value == 1
    with pytest.raises(ValueError, match="unknown FFN-only model"):
        ffn_model("xxxl")
    with pytest.raises(ValueError, match="positive integer"):
        FFNStack(name="bad", d_model=0, d_ff=5, num_blocks=2)


def test_flops_plan_comes_from_the_accounting():
    config = preset("small")
    plan = flops_plan("small", config, batch_size=3, seq_len=96, mode="train-step", contexts=[64, 256, 1024])
    total = {r["component"]: r for r in plan["parameters"]}["total"]
    assert total["parameters"] == parameter_counts(config)["total"]
    flops = {r["component"]: r for r in plan["flops"]}
    assert flops["total"]["step_gflop"] * 1e9 == pytest.approx(step_flops(config, 3, 96, "train-step"))
    assert flops["total"]["backward_gflop"] == pytest.approx(2 * flops["total"]["forward_gflop"])
    parts = sum(r["forward_gflop"] for k, r in flops.items() if k != "total")
    assert parts == pytest.approx(flops["total"]["forward_gflop"])
    shares = [r["attention_share_pct"] for r in plan["context"]]
    assert shares == sorted(shares) and shares[0] < shares[-1]
    assert "mfu" not in plan


def test_mfu_needs_a_catalogued_device():
    known = mfu_record(1e15, 2000.0, "NVIDIA H100 80GB HBM3", "bf16")
    assert known["achieved_tflops"] == pytest.approx(500.0) and known["mfu"] == pytest.approx(500 / 989.4)
    for device in ("NVIDIA GeForce RTX 4090", None):
        unknown = mfu_record(1e15, 2000.0, device, "bf16")
        assert unknown["peak_tflops"] is None and unknown["mfu"] is None
    with pytest.raises(ValueError, match="--step-ms"):
        mfu_record(1e15, 0.0, "H100 SXM", "bf16")


def test_comm_plan_data_parallel_moves_twice_the_gradients():
    shape = model_shape("xxl", 1)
    plan = comm_plan(shape, devices=8, tokens=4096, hw=V5P, comm_dtype="bf16")
    rows = {r["strategy"]: r for r in plan["communication per step"]}
    gradient_bytes = shape.parameters * 2
    assert rows["dp"]["step_mb"] * 1e6 == pytest.approx(2 * 7 / 8 * gradient_bytes)
    assert rows["fsdp"]["step_mb"] * 1e6 == pytest.approx(3 * 7 / 8 * gradient_bytes)
    assert rows["dp"]["comm_ms"] == pytest.approx(2 * 7 / 8 * gradient_bytes / 1.8e11 * 1e3)


def test_parallel_plan_memory_and_fit():
    shape = model_shape("xxl", 1)
    plan = parallel_plan(shape, Mesh(fsdp=64), PrecisionPlan(), tokens=2048, hw=V5P)
    memory = {r["component"]: r for r in plan["memory per device"]}
    assert memory["master_weights"]["gb"] == pytest.approx(shape.parameters * 4 / 64 / 1e9)
    activations = 2048 / 64 * shape.activation_elements_per_token * 2  # bf16
    assert memory["activations"]["gb"] == pytest.approx(activations / 1e9)
    assert memory["v5p memory"]["fits"] is True
    assert plan["time per pass"][1]["phase"] == "backward"
    crowded = parallel_plan(shape, Mesh(fsdp=8), PrecisionPlan(), tokens=2048, hw=V5P)
    assert {r["component"]: r for r in crowded["memory per device"]}["v5p memory"]["fits"] is False


def test_render_markdown_and_json():
    sections = {"first": [{"a_ms": 1.5, "value": 3, "unit": "x"}], "second": [{"b": "text"}]}
    md = render_plan(sections, "md", title="T", command="lmscope plan x")
    assert md.startswith("# T\n\nGenerated by `lmscope plan x`.") and "## first" in md and "## second" in md
    assert "| a_ms |" in md and "unit" not in md  # value/unit stay in JSON only
    data = json.loads(render_plan(sections, "json", title="T"))
    assert data["sections"]["first"][0] == {"a_ms": 1.5, "value": 3, "unit": "x"}


def test_cli_worked_example_json(capsys):
    main(["plan", "parallel", "--model", "xxl", "--worked-example", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    rows = [r for section in data["sections"].values() for r in section]
    assert any(r["value"] == 219_848_638_464 for r in rows)
    assert data["command"].startswith("lmscope")


@pytest.mark.parametrize("argv", [
    ["plan", "flops", "--model", "xxl"],
    ["plan", "flops", "--batch-size", "0"],
    ["plan", "parallel", "--tp", "0"],
    ["plan", "comm", "--device-name", "RTX 4090"],
    ["plan", "flops", "--format", "xml"],
    ["plan", "checkpoint", "--treatments", "full,recompute"],
    ["plan", "checkpoint", "--device", "RTX 4090"],
    ["plan", "checkpoint", "--fast", "on", "--mode", "forward-backward"],
])
def test_cli_user_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("lmscope: error:")


def test_memory_plan_is_predict_memory():
    from lmscope.accounting.memory import predict_memory
    from lmscope.planning.plan import memory_plan

    config = preset("tiny")
    plan = memory_plan("tiny", config, batch_size=3, seq_len=40, mode="train-step", precision="bf16")
    expected = predict_memory(config, batch_size=3, seq_len=40, mode="train-step", precision="bf16")
    phases = {r["phase"]: r["predicted_gib"] for r in plan["peak per phase"]}
    assert phases["step_peak"] * 2**30 == expected.step_peak
    assert phases["backward_peak"] * 2**30 == expected.backward_peak
    components = {r["component"]: r["predicted_gib"] for r in plan["components"]}
    assert components["activations"] * 2**30 == expected.components["activations"]
    residual = plan["one residual-stream tensor"][0]
    assert residual["residual_activation_mib"] * 2**20 == 3 * 40 * 64 * 2  # bf16 (3, 40, 64)


def test_transformer_shape_uses_flops_and_memory_accounting():
    from lmscope.accounting.flops import forward_flops
    from lmscope.accounting.memory import saved_activations

    shape = model_shape("tiny", 48, activations="fp32", num_layers=3)
    config = preset("tiny", num_layers=3)
    assert shape.parameters == parameter_counts(config)["total"] and shape.num_layers == 3
    assert shape.forward_flops_per_token * 48 == pytest.approx(forward_flops(config, 1, 48)["total"])
    saved = saved_activations(config, batch_size=1, seq_len=48, precision="fp32")["total"]
    assert shape.activation_elements_per_token * 48 * 4 == pytest.approx(saved)
    # TP: AllGather + ReduceScatter around attention and MLP, each layer, each pass
    hw = Hardware(name="x", peak_flops=1e14, axis_bandwidth=1e11)
    moved = parallel_plan(shape, Mesh(tp=4), PrecisionPlan(), tokens=96, hw=hw)["communication per step"][0]
    assert moved["forward_mb"] * 1e6 == pytest.approx(2 * 2 * 3 * 0.75 * 96 * 64 * 2)
    with pytest.raises(ValueError, match="FFN-only"):
        model_shape("xxl", 8, num_heads=4)


def test_cli_plan_memory_and_flops_markdown(capsys):
    main(["plan", "memory", "--model", "tiny", "--context-length", "32", "--format", "md"])
    out = capsys.readouterr().out
    assert "## peak per phase" in out and "residual_activation_mib" in out
    main(["plan", "flops", "--model", "tiny", "--step-ms", "2.5", "--device-name", "H100 SXM",
          "--format", "md"])
    out = capsys.readouterr().out
    assert "## mfu" in out and "H100 SXM" in out and "## context" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "xl", "--tp", "3"], "tensor parallelism 3 does not divide the 25 heads of xl"),
    (["--model", "small", "--tp", "7"], "tensor parallelism 7 does not divide the 12 heads of small"),
    (["--model", "small", "--tp", "2", "--d-ff", "3069"], "does not divide d_ff 3069"),
    (["--model", "xxl", "--tp", "7"], "does not divide d_ff"),
    (["--model", "small", "--pp", "13"], "13 pipeline stages are more than the 12 layers"),
])
def test_plan_parallel_refuses_a_mesh_that_cannot_shard_the_model(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "parallel", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_plans_never_claim_a_zero_token_threshold(capsys):
    shape = model_shape("small", 1024)
    for mesh in (Mesh(), Mesh(tp=2)):  # nothing communicated; activations only, slower than the math
        plan = parallel_plan(shape, mesh, PrecisionPlan(), tokens=8192, hw=V5P)
        first = plan["compute-bound batch"][0]
        assert first["value"] == 0 and first["result"].startswith("compute bound at any batch")
    comm = comm_plan(model_shape("small", 1024), devices=7, tokens=8192, hw=V5P)
    rows = {r["strategy"]: r for r in comm["communication per step"]}
    assert rows["tp"]["collectives"].startswith("cannot hold: tensor parallelism 7")
    assert rows["dp"]["step_mb"] > 0


def test_cli_plan_checkpoint_of_the_fast_model_under_fsdp(capsys):
    main(["plan", "checkpoint", "--model", "small", "--context-length", "8192", "--batch-size", "1",
          "--attention", "flash", "--fast", "on", "--fsdp", "2", "--budget", "3.5GiB", "--device", "H200",
          "--format", "json"])
    sections = json.loads(capsys.readouterr().out)["sections"]
    setup, chosen = sections["setup"][0], sections["chosen"][0]
    assert (setup["memory_model"], setup["ranks"], setup["device"]) == ("fast-fsdp", 2, "H200")
    assert chosen["fits"] and chosen["policy"] != "none" and chosen["predicted_peak_gib"] <= 3.5 * 0.95
    command = f"lmscope ddp --strategy fsdp --nproc 2 --fast on --checkpoint {chosen['policy']}"
    assert chosen["run_it"] == command
    assert {"selective_blocks", "offloaded_blocks", "predicted_extra_pct"} <= set(sections["candidates"][0])


EIGHT_B = ["plan", "checkpoint", "--model", "small", "--d-model", "4096", "--d-ff", "11008",
           "--num-heads", "32", "--vocab-size", "151936", "--num-layers", "34", "--context-length", "32768",
           "--batch-size", "1", "--precision", "bf16", "--attention", "flash", "--fast", "on",
           "--budget", "139GiB", "--device", "H200", "--treatments", "full,selective,offload",
           "--format", "json"]


def test_cli_plan_checkpoint_with_host_optimizer_state_checkpoints_fewer_blocks(capsys):
    plans = {}
    for extra in ([], ["--optimizer-state", "host"]):
        main([*EIGHT_B, "--fsdp", "2", *extra])
        plans[tuple(extra)] = json.loads(capsys.readouterr().out)["sections"]
    device, host = plans[()], plans[("--optimizer-state", "host")]
    assert device["setup"][0]["optimizer_state"] == "device" and host["setup"][0]["optimizer_state"] == "host"
    assert host["chosen"][0]["checkpointed_blocks"] < device["chosen"][0]["checkpointed_blocks"]
    assert host["chosen"][0]["fits"] and "--optimizer-state host --checkpoint" in host["chosen"][0]["run_it"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--fsdp", "2", "--optimizer-state", "cloud"], "optimizer state 'cloud': choose one of device, host"),
    (["--optimizer-state", "host"], "pass --fast on and --fsdp 2 or more"),
])
def test_cli_plan_checkpoint_refuses_a_bad_optimizer_state_in_one_line(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*EIGHT_B, *extra])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
