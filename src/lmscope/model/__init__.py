"""The reference Transformer LM and its attention backends."""
