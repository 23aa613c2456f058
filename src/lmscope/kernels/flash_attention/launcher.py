"""Launching the autotuned Triton kernels: through ``triton.autotune`` once per key, then directly.

Once the autotuner has chosen for a key, the kernels are launched with its choice, skipping
``Autotuner.run``'s per-call work (``_Launcher``), and once Triton has compiled a kernel for the
arguments' specialisation, its launcher is called directly, skipping ``JITFunction.run``'s binder
and cache lookup (lmscope.kernels.triton_launch, which falls back to ``JITFunction.run`` wherever
it cannot be exact or launch hooks are installed).
"""

from __future__ import annotations

import inspect

import torch
import triton

from lmscope.kernels import flash_native
from lmscope.kernels.flash_attention.plan import _bucket, split_head_dim
from lmscope.kernels.flash_attention.triton_kernels import _attn_bwd_dkdv, _attn_bwd_dq, _attn_fwd
from lmscope.kernels.triton_launch import DirectLaunch, FixedArgs


class _Launcher:
    """Launches one autotuned kernel, paying for ``triton.autotune`` only until it has chosen.

    The first call at a key goes through the autotuner (``kernel[grid](...)``), which prunes and
    benchmarks the configs, with its ``reset_to_zero`` hooks, and launches the best one. Its
    choice (``kernel.best_config``) is then kept here, and later calls at that key launch the
    JIT function with it directly: the same binary, arguments and launch options that
    ``Autotuner.run`` passes on a cache hit, without its per-call work (naming every argument,
    building its key from them, merging the config's options) or a grid callback. Those
    launches go through ``DirectLaunch`` (lmscope.kernels.triton_launch), which also skips
    ``JITFunction.run``'s binder and cache lookup once Triton has compiled the kernel for the
    arguments' specialisation, and falls back to ``JITFunction.run`` where it cannot.

    ``key`` is (head dim, causal, dtype, n_queries bucket, n_keys bucket, atomic dQ,
    batch*heads > 65535). It decides everything Triton's tuning key holds (its dtypes are q's
    dtype and float32, fixed by q's dtype) and everything the pruner reads from the arguments;
    the constexpr arguments (HEAD_DIM, D_MAIN, D_TAIL, D_PAD, DOT_PREC, CAUSAL, ATOMIC_DQ, ACC64)
    follow from it.
    The kept choices are dropped whenever the autotuner's cache changed size behind our back
    (re-tuning clears it), and ``kernel.best_config`` is set on every
    launch as the autotuner does. Where this Triton lacks what the direct launch needs (the
    autotuner's ``fn``, ``cache`` and ``best_config``, ``fn.run(*args, grid, warmup, **kw)``),
    or a config has a pre_hook, every call goes through the autotuner.
    """

    def __init__(self, kernel, block: str):
        self.kernel = kernel
        self.block = block  # the tile size along the sequence axis of the grid
        self.atomic_arg = "ATOMIC_DQ" in kernel.arg_names
        self.d_pad_arg = "D_PAD" in kernel.arg_names
        self.acc64_arg = "ACC64" in kernel.arg_names
        run = getattr(getattr(kernel, "fn", None), "run", None)
        try:
            params = inspect.signature(run).parameters if run is not None else {}
        except (TypeError, ValueError):
            params = {}
        usable = hasattr(kernel, "cache") and "grid" in params and "warmup" in params
        self.run = run if usable else None
        # key -> (config, block, head_major, launch kwargs, constexpr tail, compiled kernels)
        self.known: dict[tuple, tuple] = {}
        self.n_tuned = 0  # len(kernel.cache) when self.known was last in step with it
        self.direct_launches = 0  # for tests: launches that bypassed the autotuner
        self.compiled = DirectLaunch(kernel.fn) if self.run is not None else None

    def __call__(self, key: tuple, n: int, bh: int, tensors: tuple, fixed: FixedArgs) -> None:
        """Launch over (cdiv(n, tile), bh) tiles, or (bh, cdiv(n, tile)) for HEAD_MAJOR, with the
        positional arguments ``tensors`` then ``fixed.args``."""
        hit = self.known.get(key)
        if hit is not None and len(self.kernel.cache) == self.n_tuned:
            config, block, head_major, kwargs, tail, compiled = hit
            tiles = -(-n // block)
            self.kernel.best_config = config
            self.direct_launches += 1
            grid = (bh, tiles) if head_major else (tiles, bh)
            if tail is None:
                self.run(*tensors, *fixed.args, grid=grid, warmup=False, **kwargs)
            else:
                self.compiled.launch(compiled, grid, tensors, fixed, tail, kwargs)
            return
        self._autotuned(key, n, bh, (*tensors, *fixed.args))

    def _autotuned(self, key: tuple, n: int, bh: int, args: tuple) -> None:
        """Launch through the autotuner and keep its choice for ``key``."""
        kernel, block = self.kernel, self.block
        cache = getattr(kernel, "cache", None)
        if cache is None:
            cache = {}
        elif len(cache) != self.n_tuned:  # cleared or filled by someone else: learn again
            self.known.clear()
            flash_native.reset()
        d, causal, dtype, _, _, atomic, big = key
        d_main, d_tail = split_head_dim(d)
        consts = {
            "HEAD_DIM": d,
            "D_MAIN": d_main,
            "D_TAIL": d_tail,
            "DOT_PREC": "ieee" if dtype == torch.float32 else "tf32",
            "CAUSAL": causal,
        }
        if self.d_pad_arg:
            consts["D_PAD"] = _bucket(d)
        if self.atomic_arg:
            consts["ATOMIC_DQ"] = atomic
        if self.acc64_arg:
            consts["ACC64"] = dtype == torch.float32
        if big:
            # Triton's key does not hold batch*heads: a config tuned with fewer of them may put
            # them on grid axis 1 (at most 65535). Forget such choices so the pruner runs again.
            for stale in [k for k, c in cache.items() if not c.kwargs.get("HEAD_MAJOR")]:
                del cache[stale]

        def grid(meta):
            tiles = triton.cdiv(n, meta[block])
            return (bh, tiles) if meta["HEAD_MAJOR"] else (tiles, bh)

        kernel[grid](*args, **consts)
        self.n_tuned = len(cache)
        config = getattr(kernel, "best_config", None)
        if self.run is not None and config is not None and config.pre_hook is None:
            kwargs = {**consts, **config.all_kwargs()}
            # the constexprs after the positional arguments, in the kernel's parameter order
            names = getattr(kernel.fn, "arg_names", [])[len(args):]
            tail = tuple(kwargs[a] for a in names) if set(names) <= kwargs.keys() else None
            head_major = bool(config.kwargs["HEAD_MAJOR"])
            self.known[key] = (config, config.kwargs[block], head_major, kwargs, tail, {})

    def kept_kernel(self, key: tuple, fixed: FixedArgs) -> tuple | None:
        """(CompiledKernel, tile, head_major, constexpr tail) of the direct launch at ``key``
        with ``fixed`` and 16-byte aligned tensors on the current device, once one has run; None
        before that, or where launches go through the autotuner or ``JITFunction.run``."""
        hit = self.known.get(key)
        if self.compiled is None or hit is None or hit[4] is None or len(self.kernel.cache) != self.n_tuned:
            return None
        kernel = self.compiled.kept_aligned(hit[5], fixed)
        return None if kernel is None else (kernel, hit[1], hit[2], hit[4])


_FWD_LAUNCH = _Launcher(_attn_fwd, "BLOCK_M")
_DKDV_LAUNCH = _Launcher(_attn_bwd_dkdv, "BLOCK_N1")
_DQ_LAUNCH = _Launcher(_attn_bwd_dq, "BLOCK_M2")
_LAUNCHERS = (_FWD_LAUNCH, _DQ_LAUNCH, _DKDV_LAUNCH)
