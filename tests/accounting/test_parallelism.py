"""Sharded-step accounting on small cases worked by hand, and the Scaling Book's closed forms."""

import random

import pytest

from lmscope.accounting.parallelism import (
    Hardware,
    Mesh,
    ModelShape,
    PrecisionPlan,
    compute_bound_tokens,
    dp_critical_batch,
    hardware,
    memory_per_device,
    mixed_critical_batch,
    mixed_min_batch_per_device,
    ring_factor,
    tp_max_degree,
    traffic,
)

# Scaling Book, TPU v5p: C = 4.6e14 FLOP/s, W_ici = 2 * 9e10 B/s.
V5P = Hardware(name="v5p", peak_flops=4.6e14, axis_bandwidth=1.8e11)


def mlp_stack(d: int, f: int, layers: int) -> ModelShape:
    """The Book's model: L blocks of W_in[D, F], W_out[F, D]."""
    params = 2 * d * f * layers
    return ModelShape(name="mlp", parameters=params, d_model=d, d_ff=f, num_layers=layers,
                      forward_flops_per_token=2.0 * params, activation_elements_per_token=layers * (d + f))


SMALL = ModelShape(name="hand", parameters=1000, d_model=6, d_ff=10, num_layers=3,
                   forward_flops_per_token=2000.0, activation_elements_per_token=10, tp_blocks_per_layer=2)
FP32_WIRE = PrecisionPlan(communication="fp32")


def test_memory_per_device_by_hand():
    mesh = Mesh(dp=3, fsdp=2, tp=2)
    memory = memory_per_device(SMALL, mesh, PrecisionPlan(), tokens=120)
    # states: 1000 params / (fsdp 2 * tp 2) = 250 params at 4 + 4 + 2*4 bytes
    assert memory["master_weights"] == 1000 and memory["gradients"] == 1000
    assert memory["optimizer_state"] == 2000
    # activations: 120 tokens / (dp 3 * fsdp 2) = 20 per replica, / tp 2 = 10; 10 elements of 2 bytes each
    assert memory["activations"] == 10 * 10 * 2
    assert memory["total"] == 4200


def test_traffic_by_hand():
    mesh = Mesh(dp=4, fsdp=2, tp=2, pp=1)
    moved = {t.axis: t for t in traffic(SMALL, mesh, FP32_WIRE, tokens=16, hw=V5P)}
    # DP: AllReduce of the fsdp x tp shard's gradients, 2 (n-1)/n x 250 params x 4 bytes
    assert moved["dp"].forward_bytes == 0 and moved["dp"].backward_bytes == 2 * 0.75 * 250 * 4
    # FSDP: (X-1)/X of the TP shard's weights (500 params x 4 bytes), gathered fwd; gathered + scattered bwd
    assert moved["fsdp"].forward_bytes == 0.5 * 2000 and moved["fsdp"].backward_bytes == 2 * 0.5 * 2000
    # TP: 2 blocks x (AllGather + ReduceScatter) x 3 layers x (Y-1)/Y x (16 / 8 tokens x D 6 x 4 bytes)
    assert moved["tp"].forward_bytes == 2 * 2 * 3 * 0.5 * (2 * 6 * 4) == moved["tp"].backward_bytes
    assert "pp" not in moved


def test_pipeline_sends_boundary_activations_and_splits_layers():
    mesh = Mesh(pp=3, tp=2)
    moved = {t.axis: t for t in traffic(SMALL, mesh, FP32_WIRE, tokens=5, hw=V5P)}
    assert moved["pp"].forward_bytes == 5 * 6 * 4 == moved["pp"].backward_bytes
    assert moved["tp"].forward_bytes == 2 * 2 * (3 / 3) * 0.5 * 5 * 6 * 4  # one layer per stage


def test_ring_factor():
    assert ring_factor(1) == 0 and ring_factor(4) == 0.75 and ring_factor(4, exact=False) == 1


def test_book_thresholds():
    assert dp_critical_batch(4.6e14, 1.8e11) == pytest.approx(2555.6, abs=0.1)  # Book: ~2,550
    assert dp_critical_batch(4.6e14, 1.8e11, axes=3) == pytest.approx(851.9, abs=0.1)  # Book: ~850
    alpha_2550 = 2550 * 1.8e11
    assert tp_max_degree(30_000, alpha_2550, 1.8e11) == pytest.approx(11.76, abs=0.01)  # LLaMA-3 70B
    assert mixed_min_batch_per_device(30_000, alpha_2550, 1.8e11, 2, 1) == pytest.approx(433.5)  # Book: 432


@pytest.mark.parametrize("axes", [1, 3])
def test_solver_reproduces_book_for_dp_and_fsdp(axes):
    rng = random.Random(axes)
    shape = mlp_stack(rng.choice([1024, 2048]), rng.choice([4096, 8192]), rng.randint(2, 9))
    for mesh in (Mesh(dp=16, dp_axes=axes), Mesh(fsdp=16, fsdp_axes=axes)):
        tokens = compute_bound_tokens(shape, mesh, PrecisionPlan(), V5P, ring_factors=False)
        assert tokens / 16 == pytest.approx(dp_critical_batch(4.6e14, 1.8e11, axes))


def test_solver_tp_alone_depends_on_width_not_batch():
    narrow, wide = mlp_stack(512, 2048, 2), mlp_stack(512, 65536, 2)
    mesh = Mesh(tp=4)  # compute bound iff Y < F W / C: 2048 -> 0.8, 65536 -> 25.6
    assert compute_bound_tokens(narrow, mesh, PrecisionPlan(), V5P, ring_factors=False) is None
    assert compute_bound_tokens(wide, mesh, PrecisionPlan(), V5P, ring_factors=False) == 0


def test_solver_reproduces_book_mixed_fsdp_tp():
    shape = mlp_stack(4096, 28672, 5)
    mesh = Mesh(fsdp=16, tp=4, fsdp_axes=2, tp_axes=1)
    solved = compute_bound_tokens(shape, mesh, PrecisionPlan(), V5P, ring_factors=False)
    closed = mixed_critical_batch(28672, 16, 4, 4.6e14, 1.8e11, 2, 1)
    assert solved == pytest.approx(closed, rel=1e-9)
    # the ring factors (n-1)/n move fewer bytes, so a smaller batch suffices
    assert compute_bound_tokens(shape, mesh, PrecisionPlan(), V5P) < solved
    # no split of the same 64 devices beats the Book's floor
    assert closed / 64 >= mixed_min_batch_per_device(28672, 4.6e14, 1.8e11, 2, 1)


def test_no_communication_is_always_compute_bound():
    assert compute_bound_tokens(SMALL, Mesh(), PrecisionPlan(), V5P) == 0


def test_hardware_from_catalog_and_overrides():
    tpu = hardware("TPU v5p", "bf16")
    assert tpu.peak_flops == 459e12 and tpu.axis_bandwidth == 180e9 and tpu.memory_bytes == 95e9
    assert hardware("H100 SXM", "bf16", bandwidth_gbps=100).axis_bandwidth == 100e9
    with pytest.raises(ValueError, match="--peak-tflops"):
        hardware("RTX 4090", "bf16")
    assert hardware("RTX 4090", "bf16", peak_tflops=165, bandwidth_gbps=32).memory_bytes is None


@pytest.mark.parametrize("bad", [dict(tp=0), dict(dp=-1), dict(fsdp=1.5), dict(tp_axes=0), dict(dp=2**40)])
def test_mesh_rejects_bad_degrees(bad):
    with pytest.raises(ValueError, match="must be an integer from 1 to"):
        Mesh(**bad)


def test_precision_plan():
    assert PrecisionPlan().state_bytes_per_parameter == 16
    assert PrecisionPlan(master="bf16", optimizer_states=1).state_bytes_per_parameter == 2 + 4 + 4
    with pytest.raises(ValueError, match="unknown dtype"):
        PrecisionPlan(activations="int4")
