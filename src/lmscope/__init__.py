"""lmscope: measure, profile and speed up Transformer LM training steps."""
__version__ = "0.1.0"
