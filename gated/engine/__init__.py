"""The gate model engine: exact encoder-decoder transformer, hand-written backward, AdamW.

No I/O and no threads here; the daemon wraps it.
"""

from .config import ModelConfig
from .layout import param_layout
from .model import Model, get_ops
from .optim import EWC, AdamW, Schedule
from .tokenizer import BOS, EOS, PAD, SEP, build_batch, decode_bytes, encode_source, source_batch
from .train import train_step

__all__ = [
    "AdamW", "BOS", "EOS", "EWC", "Model", "ModelConfig", "PAD", "SEP", "Schedule",
    "build_batch", "decode_bytes", "encode_source", "get_ops", "param_layout",
    "source_batch", "train_step",
]
