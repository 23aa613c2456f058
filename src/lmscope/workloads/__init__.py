"""Workloads: what one measured point runs on the device."""
