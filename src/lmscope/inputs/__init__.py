"""What a user may ask for, checked before anything runs or imports torch: the spelled-out choices
of a point, the items of a list flag, and the upper bounds on sizes, steps and timeouts; and the
grid of points those flags ask for (`grid`).

Specs (`workloads/`, `sources/`), `config` and the command line all check through these modules,
so a mistake is refused in one line whichever way it came in.
"""
