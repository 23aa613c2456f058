"""Data parallelism on torch.distributed: launch, DDP wrappers, sharded optimizer."""
