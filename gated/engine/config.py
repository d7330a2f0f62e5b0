"""Model configuration: the two presets of DESIGN.md section 1 and a stable fingerprint.

The fingerprint goes into every checkpoint so that weights trained for one shape are
never loaded silently into another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the encoder-decoder transformer (byte vocabulary, pre-LayerNorm)."""

    vocab_size: int = 260
    d_model: int = 256
    n_heads: int = 8
    d_ff: int = 1024
    n_enc_layers: int = 4
    n_dec_layers: int = 2
    max_seq_len: int = 256
    ln_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "heads are contiguous slices of d_model"
            )
        if self.d_model % 2 != 0:
            raise ValueError(f"d_model={self.d_model} must be even for the sinusoidal encoding")
        for name in ("vocab_size", "d_ff", "n_enc_layers", "n_dec_layers", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def tiny(cls) -> ModelConfig:
        """The small shape the tests train in seconds."""
        return cls(d_model=32, n_heads=4, d_ff=64, n_enc_layers=2, n_dec_layers=2, max_seq_len=32)

    @classmethod
    def flint(cls) -> ModelConfig:
        """The gateway's FLINT shape (256-d, 8 heads): the default."""
        return cls()

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        presets = {"tiny": cls.tiny, "flint": cls.flint}
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(presets)}")
        return presets[name]()

    def to_dict(self) -> dict:
        return asdict(self)

    def fingerprint(self) -> str:
        """A stable hash of every field: equal shapes give equal fingerprints."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=12).hexdigest()
