"""The peer of the long-context step: transformers' Llama as a user would shard it today.

LlamaForCausalLM (SDPA attention) at a lmscope ModelConfig's sizes, full activation
checkpointing (HF's gradient_checkpointing_enable, non-reentrant), `fully_shard` per decoder
layer then the root with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), the loss
from `labels` (HF computes full logits), foreach AdamW. Runs on --nproc local ranks and writes
one JSON row (step times, memory per rank) to --out.

    PYTHONPATH=src python3 benchmarks/distributed/llama_fsdp2_peer.py --nproc 2 --d-model 4096 \
        --d-ff 11008 --num-layers 34 --num-heads 32 --vocab-size 151936 --context-length 32768 \
        --batch-size 1 --out $OUT/llama_peer.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from lmscope.config import ModelConfig
from lmscope.model.hf_peer import llama_config_kwargs
from lmscope.parallel.launch import RankContext, across_ranks, launch
from lmscope.records.results import provenance

GIB = 2**30


def train(ctx: RankContext, args: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    config = ModelConfig(vocab_size=args["vocab_size"], context_length=args["context_length"],
                         d_model=args["d_model"], d_ff=args["d_ff"], num_layers=args["num_layers"],
                         num_heads=args["num_heads"])
    torch.manual_seed(0)
    with ctx.device:
        model = LlamaForCausalLM(LlamaConfig(**llama_config_kwargs(config)))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    generator = torch.Generator(device=ctx.device).manual_seed(1000 + ctx.rank)
    tokens = torch.randint(0, config.vocab_size, (args["batch_size"], args["context_length"]),
                           device=ctx.device, generator=generator)
    torch.cuda.synchronize(ctx.device)
    init_gib = torch.cuda.memory_allocated(ctx.device) / GIB
    times = []
    for index in range(args["warmup"] + args["steps"]):
        torch.cuda.reset_peak_memory_stats(ctx.device)
        torch.cuda.synchronize(ctx.device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        torch.cuda.synchronize(ctx.device)
        if index >= args["warmup"]:
            times.append(1e3 * (time.perf_counter() - start))
    local = {"step_ms": statistics.fmean(times), "step_median_ms": statistics.median(times),
             "init_allocated_gib": init_gib,
             "peak_allocated_gib": torch.cuda.max_memory_allocated(ctx.device) / GIB,
             "peak_reserved_gib": torch.cuda.max_memory_reserved(ctx.device) / GIB}
    metrics = across_ranks(local)
    metrics.update(peak_allocated_rank0_gib=local["peak_allocated_gib"] if ctx.rank == 0 else None,
                   parameters=sum(p.numel() for p in model.parameters()),
                   times_ms=[round(t, 3) for t in times])  # this rank's: the ratio's interval
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("nproc", 2), ("d-model", 4096), ("d-ff", 11008), ("num-layers", 34),
                          ("num-heads", 32), ("vocab-size", 151936), ("context-length", 32768),
                          ("batch-size", 1), ("warmup", 2), ("steps", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=1500.0)
    args = vars(parser.parse_args())
    row: dict[str, Any] = {**provenance(), "strategy": "hf-llama-fsdp2-ac", "world_size": args["nproc"],
                           **{k: v for k, v in args.items() if k not in ("out", "timeout", "nproc")}}
    try:
        row.update(launch(train, args, nproc=args["nproc"], backend="nccl", timeout_s=args["timeout"]),
                   status="ok")
    except Exception as error:  # a failed rank or an OOM is a row too
        row.update(status="oom" if "out of memory" in str(error).lower() else "error",
                   error=str(error).splitlines()[0][:300])
    with open(args["out"], "a") as stream:
        stream.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
