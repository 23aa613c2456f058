"""Answers without a measured run: `lmscope plan` (FLOPs, memory, communication, parallelism,
checkpointing, presets) and `lmscope precision` (what low precision does to sums and under autocast)."""
