"""Analytic calculators (FLOPs, memory, communication, devices): no GPU, no device state."""
