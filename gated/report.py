"""`gated report`: a PNG of loss and alignment over time from the metrics history.

The allowed dependencies have no plotting library, so this draws two line charts into a
numpy RGB canvas and writes the PNG with zlib (the format is simple: signature, IHDR,
one IDAT of filtered scanlines, IEND). Good enough to see convergence at a glance.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

WIDTH, PANEL_H, MARGIN = 800, 260, 30
BLUE, GREEN, GREY, BLACK = (31, 119, 180), (44, 160, 44), (200, 200, 200), (0, 0, 0)

# 3x5 digit glyphs, enough to label the axes' ranges.
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    "e": "000111111100111", "+": "000010111010000",
}


def write_png(path: str | Path, rgb: np.ndarray) -> None:
    """Write an [H, W, 3] uint8 array as an 8-bit RGB PNG."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))  # filter type 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    Path(path).write_bytes(png)


def _text(img: np.ndarray, x: int, y: int, s: str, color=BLACK, scale: int = 2) -> None:
    for ch in s:
        glyph = _GLYPHS.get(ch)
        if glyph:
            for i, bit in enumerate(glyph):
                if bit == "1":
                    r, c = divmod(i, 3)
                    img[y + r * scale : y + (r + 1) * scale,
                        x + c * scale : x + (c + 1) * scale] = color
        x += 4 * scale


def _line(img: np.ndarray, x0: float, y0: float, x1: float, y1: float, color) -> None:
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.linspace(x0, x1, n).round().astype(int)
    ys = np.linspace(y0, y1, n).round().astype(int)
    ok = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
    img[ys[ok], xs[ok]] = color
    img[np.clip(ys[ok] + 1, 0, img.shape[0] - 1), xs[ok]] = color


def _panel(img: np.ndarray, top: int, xs: np.ndarray, ys: np.ndarray, color,
           lo: float | None = None, hi: float | None = None) -> None:
    left, right, bottom = MARGIN + 40, WIDTH - MARGIN, top + PANEL_H - MARGIN
    img[top + MARGIN : bottom, left] = GREY
    img[bottom, left:right] = GREY
    finite = np.isfinite(ys)
    if finite.sum() == 0:
        return
    xs, ys = xs[finite], ys[finite]
    lo = float(ys.min()) if lo is None else lo
    hi = float(ys.max()) if hi is None else hi
    hi = hi if hi > lo else lo + 1.0
    xspan = max(float(xs.max() - xs.min()), 1.0)
    px = left + (xs - xs.min()) / xspan * (right - left)
    py = bottom - (ys - lo) / (hi - lo) * (bottom - top - MARGIN)
    for i in range(len(px) - 1):
        _line(img, px[i], py[i], px[i + 1], py[i + 1], color)
    if len(px) == 1:
        _line(img, px[0], py[0], px[0] + 1, py[0], color)
    _text(img, 4, top + MARGIN, f"{hi:.3g}")
    _text(img, 4, bottom - 10, f"{lo:.3g}")
    _text(img, right - 60, bottom + 6, f"{int(xs.max())}")


def render(history: Sequence[dict], path: str | Path) -> int:
    """Draw loss (top, blue) and alignment (bottom, green, 0..1) against step.

    `history` is the store's metrics history: dicts with "step", "loss", "alignment".
    """
    img = np.full((2 * PANEL_H, WIDTH, 3), 255, dtype=np.uint8)
    steps = np.array([r["step"] for r in history], dtype=float)
    loss = np.array([r.get("loss", np.nan) for r in history], dtype=float)
    align = np.array([r.get("alignment", np.nan) for r in history], dtype=float)
    if len(steps):
        _panel(img, 0, steps, loss, BLUE)
        _panel(img, PANEL_H, steps, align, GREEN, 0.0, 1.0)
    write_png(path, img)
    return len(steps)


#: Colours for :func:`render_panels` (cycled).
COLORS = (BLUE, GREEN, (214, 39, 40), (148, 103, 189), (255, 127, 14))


def render_panels(panels: Sequence[tuple[Sequence[float], Sequence[float]]],
                  path: str | Path, *, floors: Sequence[float | None] | None = None) -> None:
    """One line chart per (xs, ys) pair, stacked top to bottom (bench/bench_soak.py draws
    RSS and latency over time with it). ``floors[i]`` fixes panel i's lower bound (e.g.
    0, so that a flat line is not magnified)."""
    img = np.full((max(1, len(panels)) * PANEL_H, WIDTH, 3), 255, dtype=np.uint8)
    for i, (xs, ys) in enumerate(panels):
        lo = floors[i] if floors is not None and i < len(floors) else None
        _panel(img, i * PANEL_H, np.asarray(xs, dtype=float), np.asarray(ys, dtype=float),
               COLORS[i % len(COLORS)], lo)
    write_png(path, img)
