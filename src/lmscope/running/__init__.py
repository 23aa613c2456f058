"""Running points: grid expansion, one isolated worker process per point (timeouts, OOM capture,
resume), the worker's side of that exchange, and temporary folders a `kill -9` cannot leave behind."""
