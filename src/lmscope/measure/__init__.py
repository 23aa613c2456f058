"""Measurement probes: timing, ranges, kernel and memory profiling."""
