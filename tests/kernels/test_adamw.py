"""FusedAdamW (Triton) against torch.optim.AdamW and the float64 reference step, with shadows.

Without CUDA the kernel runs in Triton's interpreter, which must be switched on before Triton
decorates it: `test_adamw_in_interpreter` reruns this file in a child pytest with
TRITON_INTERPRET=1, and the tests below skip in the parent.
"""

from __future__ import annotations

import copy

import pytest
import torch
from triton_child import module_under_test, rerun_in_interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_adamw_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def aw():
    return module_under_test("lmscope.kernels.adamw", "test_adamw_in_interpreter")


def _params(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(37, 5), (3001,), (1,), (4, 3, 7)]  # odd sizes, one longer than a block
    return [torch.randn(*s, generator=gen).to(DEVICE).requires_grad_() for s in shapes]


def test_matches_torch_adamw_over_steps_with_two_groups(aw) -> None:
    ours, theirs = _params(1), _params(1)
    settings = [dict(lr=3e-3, weight_decay=0.1), dict(lr=1e-2, weight_decay=0.0, betas=(0.8, 0.95))]

    def groups(params):
        return [dict(params=params[:2], **settings[0]), dict(params=params[2:], **settings[1])]

    fused = aw.FusedAdamW(groups(ours), eps=1e-6)
    reference = torch.optim.AdamW(groups(theirs), eps=1e-6)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=gen).to(DEVICE) for p in ours]
        for params in (ours, theirs):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
        fused.step()
        reference.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)
        assert fused.state[a]["step"].item() == 5


def test_one_step_against_the_float64_reference(aw) -> None:
    gen = torch.Generator().manual_seed(3)
    p, g = torch.randn(513, generator=gen), torch.randn(513, generator=gen)
    m, v = torch.randn(513, generator=gen) * 0.1, torch.rand(513, generator=gen) * 0.01
    param = p.clone().to(DEVICE).requires_grad_()
    opt = aw.FusedAdamW([param], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    opt.state[param].update(step=torch.tensor(6.0, device=DEVICE), exp_avg=m.clone().to(DEVICE),
                            exp_avg_sq=v.clone().to(DEVICE))
    param.grad = g.clone().to(DEVICE)
    opt.step()
    want = p.double()
    aw.adamw_reference(want, g.double(), m.double(), v.double(), 7, lr=1e-2, beta1=0.9, beta2=0.99,
                       eps=1e-8, weight_decay=0.05)
    torch.testing.assert_close(param.detach().cpu().double(), want, rtol=1e-6, atol=1e-6)


def test_shadows_hold_the_updated_parameter_in_bf16_and_stay_fresh(aw) -> None:
    from lmscope.model.shadow_weights import ShadowWeights

    params = _params(4)
    shadows = ShadowWeights([params[:1], params[1:3]], torch.bfloat16)  # same trailing dims
    stale = [s.clone() for s in (shadows.stack(0), shadows.stack(1))]
    opt = aw.FusedAdamW(params, lr=1e-2, shadows=lambda: shadows)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    for p in params[:3]:
        # the interpreter truncates fp32 -> bf16 stores where the GPU rounds: 1 bf16 ulp apart
        torch.testing.assert_close(shadows.views[p].float(), p.detach().to(torch.bfloat16).float(),
                                   rtol=2 ** -7, atol=0)
    assert not torch.equal(shadows.stacks[0], stale[0]) and not torch.equal(shadows.stacks[1], stale[1])
    written = shadows.stacks[0].clone()
    assert torch.equal(shadows.stack(0), written)  # fresh: not copied again from the masters
    with torch.no_grad():
        params[0].add_(1.0)  # a PyTorch in-place update bumps the version: copied again
    assert torch.equal(shadows.stack(0), params[0].detach().to(torch.bfloat16))


def test_skips_parameters_without_gradients_and_rejects_bad_settings(aw) -> None:
    a, b = _params(5)[:2]
    before = b.detach().clone()
    opt = aw.FusedAdamW([a, b])
    a.grad = torch.ones_like(a)
    opt.step()
    assert torch.equal(b.detach(), before) and b not in opt.state
    with pytest.raises(ValueError, match="betas"):
        aw.FusedAdamW([a], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=">= 0"):
        aw.FusedAdamW([a], lr=-1.0)


def test_continues_from_a_torch_adamw_state_dict_and_refuses_amsgrad(aw) -> None:
    ours, theirs = _params(6), _params(6)
    reference = torch.optim.AdamW(theirs, lr=1e-2)
    gen = torch.Generator().manual_seed(7)

    def step(params, optimizer, grads) -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        optimizer.step()

    for _ in range(2):
        step(theirs, reference, [torch.randn(p.shape, generator=gen).to(DEVICE) for p in theirs])
    with torch.no_grad():
        for a, b in zip(ours, theirs, strict=True):
            a.copy_(b)
    fused = aw.FusedAdamW(ours, lr=1e-2)
    fused.load_state_dict(copy.deepcopy(reference.state_dict()))  # torch would share the tensors
    grads = [torch.randn(p.shape, generator=gen).to(DEVICE) for p in ours]
    step(ours, fused, grads)
    step(theirs, reference, grads)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)
    assert fused.state[ours[0]]["step"].item() == 3

    amsgrad = aw.FusedAdamW(ours, lr=1e-2)
    amsgrad.load_state_dict(torch.optim.AdamW(_params(6), amsgrad=True).state_dict())
    with pytest.raises(ValueError, match="amsgrad or maximize"):
        step(ours, amsgrad, grads)


def _toy_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(13, 31), torch.nn.GELU(), torch.nn.Linear(31, 5))
    model[0].bias.requires_grad_(False)  # frozen: never hooked, never updated
    return model.to(DEVICE)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(7, 13, generator=gen).to(DEVICE)
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()


def test_step_in_backward_trains_exactly_like_the_separate_step(aw) -> None:
    separate, inside = _toy_model(8), _toy_model(8)
    frozen = inside[0].bias.detach().clone()

    def groups(model):
        return [dict(params=[model[0].weight], weight_decay=0.1),
                dict(params=[model[2].weight, model[2].bias], lr=3e-3, betas=(0.8, 0.95))]

    want = aw.FusedAdamW(groups(separate), lr=1e-2)
    got = aw.FusedAdamW(groups(inside), lr=1e-2, step_in_backward=True)
    _train(separate, want, 4, seed=9)
    _train(inside, got, 4, seed=9)
    for (name, a), b in zip(separate.named_parameters(), inside.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert torch.equal(inside[0].bias.detach(), frozen)
    assert got.state[inside[2].bias]["step"].item() == 4
    assert inside[0].bias not in got.state


def test_step_in_backward_updates_inside_the_backward(aw) -> None:
    model = _toy_model(10)
    optimizer = aw.FusedAdamW(model.parameters(), lr=1e-2, step_in_backward=True)
    before = model[2].weight.detach().clone()
    model(torch.randn(3, 13).to(DEVICE)).sum().backward()
    optimizer.wait_for_backward_updates()
    assert not torch.equal(model[2].weight.detach(), before)  # before step() is called
    assert optimizer.state[model[2].weight]["step"].item() == 0  # step() advances the count
    optimizer.step()
    assert optimizer.state[model[2].weight]["step"].item() == 1


def test_step_in_backward_refuses_a_second_backward_before_step(aw) -> None:
    model = _toy_model(11)
    optimizer = aw.FusedAdamW(model.parameters(), step_in_backward=True)  # noqa: F841 - hooks hold it weakly
    x = torch.randn(3, 13).to(DEVICE)
    model(x).sum().backward()
    with pytest.raises(RuntimeError, match="call step\\(\\) after each backward"):
        model(x).sum().backward()


def test_step_in_backward_hooks_an_added_param_group(aw) -> None:
    model = _toy_model(12)
    optimizer = aw.FusedAdamW([model[0].weight], lr=1e-2, step_in_backward=True)
    optimizer.add_param_group(dict(params=[model[2].weight]))
    before = model[2].weight.detach().clone()
    model(torch.randn(3, 13).to(DEVICE)).sum().backward()
    optimizer.wait_for_backward_updates()
    assert not torch.equal(model[2].weight.detach(), before)


def test_step_in_backward_leaves_nothing_alive_after_the_model_is_dropped(aw) -> None:
    import gc
    import weakref

    model = _toy_model(13)
    optimizer = aw.FusedAdamW(model.parameters(), step_in_backward=True)
    _train(model, optimizer, 1, seed=14)
    refs = [weakref.ref(model), weakref.ref(optimizer), weakref.ref(model[2].weight)]
    del model, optimizer
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_step_in_backward_reads_the_groups_of_a_loaded_state_dict(aw) -> None:
    separate, inside = _toy_model(15), _toy_model(15)
    want = aw.FusedAdamW(separate.parameters(), lr=1e-2)
    got = aw.FusedAdamW(inside.parameters(), lr=1e-2, step_in_backward=True)
    _train(separate, want, 1, seed=16)
    _train(inside, got, 1, seed=16)
    for optimizer in (want, got):
        state = copy.deepcopy(optimizer.state_dict())
        state["param_groups"][0]["lr"] = 0.3
        optimizer.load_state_dict(state)
    _train(separate, want, 2, seed=17)
    _train(inside, got, 2, seed=17)
    for a, b in zip(separate.parameters(), inside.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_step_in_backward_counts_a_step_whose_gradient_was_dropped(aw) -> None:
    model = _toy_model(18)
    optimizer = aw.FusedAdamW(model.parameters(), step_in_backward=True)
    model(torch.randn(3, 13).to(DEVICE)).sum().backward()
    model.zero_grad(set_to_none=True)  # after the in-backward updates, before step()
    optimizer.step()
    assert optimizer.state[model[2].weight]["step"].item() == 1


def test_a_dropped_step_in_backward_optimizer_unhooks_its_parameters(aw) -> None:
    import gc

    model = _toy_model(19)
    first = aw.FusedAdamW(model.parameters(), step_in_backward=True)
    del first
    gc.collect()
    second = aw.FusedAdamW(model.parameters(), step_in_backward=True)
    _train(model, second, 2, seed=20)  # the first one's hooks would have been called here too
    assert len(model[2].weight._post_accumulate_grad_hooks) == 1


def test_update_with_gradients_is_the_step_from_those_gradients(aw) -> None:
    """Handed-over bf16 gradients update as a .grad of the same values would, and never land in .grad."""
    handed, separate = _params(21)[:2], _params(21)[:2]
    got = aw.FusedAdamW(handed, lr=1e-2, step_in_backward=True)
    want = aw.FusedAdamW(separate, lr=1e-2)
    gen = torch.Generator().manual_seed(22)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen).to(DEVICE, torch.bfloat16) for p in handed]
        assert got.update_with_gradients(handed, grads)
        for p, g in zip(separate, grads, strict=True):
            p.grad = g.float()
        got.step()
        want.step()
    for a, b in zip(handed, separate, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert a.grad is None and got.state[a]["step"].item() == 3


def test_update_with_gradients_declines_what_it_does_not_step_in_backward(aw) -> None:
    params = _params(23)
    grads = [torch.zeros_like(p) for p in params]
    assert not aw.FusedAdamW(params).update_with_gradients(params, grads)  # steps separately
    partial = aw.FusedAdamW(params[:1], step_in_backward=True)
    before = params[0].detach().clone()
    assert not partial.update_with_gradients(params[:2], grads[:2])  # params[1] is not its own
    assert torch.equal(params[0].detach(), before)


def test_a_gradient_handed_over_twice_or_also_accumulated_is_refused(aw) -> None:
    params = _params(24)[:2]
    optimizer = aw.FusedAdamW(params, lr=1e-2, step_in_backward=True)
    grads = [torch.ones_like(p) for p in params]
    assert optimizer.update_with_gradients(params[:1], grads[:1])
    with pytest.raises(RuntimeError, match="handed over twice in one backward"):
        optimizer.update_with_gradients(params, grads)  # checked before params[1] is updated
    before = params[1].detach().clone()
    with pytest.raises(RuntimeError, match="reached .grad of a weight whose gradient"):
        (params[0] * 2).sum().backward()  # a second use of params[0] outside the hand-over
    optimizer.step()
    assert torch.equal(params[1].detach(), before)  # never updated, its count untouched
    assert optimizer.state[params[0]]["step"].item() == 1 and params[1] not in optimizer.state


def test_a_misshapen_handed_over_gradient_leaves_no_trace(aw) -> None:
    params = _params(25)[:1]
    optimizer = aw.FusedAdamW(params, lr=1e-2, step_in_backward=True)
    with pytest.raises(ValueError, match="a gradient of shape"):
        optimizer.update_with_gradients(params, [torch.zeros(2, device=DEVICE)])
    assert optimizer.update_with_gradients(params, [torch.ones_like(params[0])])  # not "twice"
