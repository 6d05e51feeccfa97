"""The predicted-versus-realised gain plot (``e2e.png``).

Uses matplotlib when it is installed. The GPU image has no matplotlib, so a small built-in
renderer draws the same chart (points with both intervals as error bars, the diagonal, the ±3
percentage-point band, axis ticks and labels in a 3x5 pixel font) and writes the PNG with zlib.
Pure output code: no toolkit or torch imports.
"""

from __future__ import annotations

import importlib.util
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["GainPoint", "plot_gains"]

#: Agreement band the issue asks for, in percentage points.
BAND_PP = 3.0


@dataclass(frozen=True, slots=True)
class GainPoint:
    """One concurrency level: gains as fractions (0.1 = +10%), intervals as (low, high)."""

    label: str
    predicted: float
    predicted_ci: tuple[float, float]
    realised: float
    realised_ci: tuple[float, float]


def plot_gains(points: Sequence[GainPoint], path: Path, title: str) -> str:
    """Write the chart to ``path``; returns the renderer used (``matplotlib`` or ``builtin``)."""
    if importlib.util.find_spec("matplotlib") is not None:
        _plot_matplotlib(points, path, title)
        return "matplotlib"
    _plot_builtin(points, path)
    return "builtin"


def _limits(points: Sequence[GainPoint]) -> tuple[float, float]:
    vals = [0.0, BAND_PP / 100]
    for p in points:
        vals += [p.predicted, p.realised, *p.predicted_ci, *p.realised_ci]
    lo, hi = 100 * min(vals), 100 * max(vals)
    pad = max(2.0, 0.1 * (hi - lo))
    return lo - pad, hi + pad


def _plot_matplotlib(points: Sequence[GainPoint], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = _limits(points)
    fig, ax = plt.subplots(figsize=(5.5, 5.0), dpi=120)
    grid = np.array([lo, hi])
    ax.fill_between(grid, grid - BAND_PP, grid + BAND_PP, color="0.9", label=f"±{BAND_PP:.0f} pp")
    ax.plot(grid, grid, color="0.5", lw=1, label="predicted = realised")
    for p in points:
        x, y = 100 * p.predicted, 100 * p.realised
        ax.errorbar(
            x,
            y,
            xerr=[[x - 100 * p.predicted_ci[0]], [100 * p.predicted_ci[1] - x]],
            yerr=[[y - 100 * p.realised_ci[0]], [100 * p.realised_ci[1] - y]],
            fmt="o",
            capsize=3,
        )
        ax.annotate(p.label, (x, y), textcoords="offset points", xytext=(6, 6))
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted gain (%) from build, 95% CI")
    ax.set_ylabel("realised gain (%), 95% CI across A/B pairs")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- built-in renderer -----------------------------------------------------------------------------
# 3x5 glyphs, rows top to bottom, "1" = ink.
_GLYPHS: dict[str, str] = {
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001010010010",
    "8": "111101111101111",
    "9": "111101111001111",
    "-": "000000111000000",
    "+": "000010111010000",
    ".": "000000000000010",
    "=": "000111000111000",
    "%": "101001010100101",
    "(": "010100100100010",
    ")": "010001001001010",
    " ": "000000000000000",
    "A": "010101111101101",
    "C": "111100100100111",
    "D": "110101101101110",
    "E": "111100111100111",
    "G": "111100101101111",
    "I": "111010010010111",
    "L": "100100100100111",
    "N": "110101101101101",
    "P": "111101111100100",
    "R": "110101110101101",
    "S": "111100111001111",
    "T": "111010010010010",
    "/": "001001010100100",
    "X": "101101010101101",
    "Y": "101101010010010",
    ":": "000010000010000",
    "V": "101101101101010",
    "B": "110101110101110",
    "O": "111101101101111",
    "U": "101101101101111",
    "M": "101111111101101",
    "H": "101101111101101",
}
_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]


class _Canvas:
    def __init__(self, w: int, h: int) -> None:
        self.img = np.full((h, w, 3), 255, dtype=np.uint8)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        h, w = self.img.shape[:2]
        xa, xb = sorted((max(0, min(w, x0)), max(0, min(w, x1))))
        ya, yb = sorted((max(0, min(h, y0)), max(0, min(h, y1))))
        self.img[ya:yb, xa:xb] = color

    def line(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int], width: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for t in np.linspace(0.0, 1.0, steps + 1):
            x = round(x0 + t * (x1 - x0))
            y = round(y0 + t * (y1 - y0))
            self.rect(x - width // 2, y - width // 2, x - width // 2 + width, y - width // 2 + width, color)

    def text(self, x: int, y: int, s: str, scale: int = 2, color: tuple[int, int, int] = (0, 0, 0)) -> None:
        for i, ch in enumerate(s.upper()):
            glyph = _GLYPHS.get(ch, _GLYPHS[" "])
            for r in range(5):
                for c in range(3):
                    if glyph[3 * r + c] == "1":
                        px, py = x + (4 * i + c) * scale, y + r * scale
                        self.rect(px, py, px + scale, py + scale, color)

    def png(self) -> bytes:
        h, w = self.img.shape[:2]
        raw = b"".join(b"\x00" + self.img[r].tobytes() for r in range(h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return (
                struct.pack(">I", len(data))
                + tag
                + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
            )

        header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def _plot_builtin(points: Sequence[GainPoint], path: Path) -> None:
    size, left, bottom, top, right = 640, 90, 80, 30, 30
    cv = _Canvas(size, size)
    lo, hi = _limits(points)
    span = hi - lo
    plot_w, plot_h = size - left - right, size - top - bottom

    def px(v: float) -> int:
        return left + round((v - lo) / span * plot_w)

    def py(v: float) -> int:
        return size - bottom - round((v - lo) / span * plot_h)

    for i in range(plot_w):  # the ±3 pp band around the diagonal
        v = lo + i / plot_w * span
        cv.rect(left + i, py(v + BAND_PP), left + i + 1, py(v - BAND_PP), (230, 230, 230))
    cv.rect(0, 0, size, top, (255, 255, 255))
    cv.rect(0, size - bottom, size, size, (255, 255, 255))
    cv.line(px(lo), py(lo), px(hi), py(hi), (128, 128, 128))
    cv.line(left, size - bottom, size - right, size - bottom, (0, 0, 0))
    cv.line(left, top, left, size - bottom, (0, 0, 0))
    step = 10 ** np.floor(np.log10(span / 2)) if span > 0 else 1.0
    if span / step > 8:
        step *= 2
    tick = np.ceil(lo / step) * step
    while tick <= hi:
        tick = 0.0 if abs(tick) < step / 1000 else tick
        label = f"{tick:.0f}" if step >= 1 else f"{tick:.1f}"
        cv.line(px(tick), size - bottom, px(tick), size - bottom + 6, (0, 0, 0))
        cv.text(px(tick) - 4 * len(label), size - bottom + 10, label)
        cv.line(left - 6, py(tick), left, py(tick), (0, 0, 0))
        cv.text(left - 10 - 8 * len(label), py(tick) - 5, label)
        tick += step
    cv.text(left + plot_w // 2 - 100, size - 35, "PREDICTED GAIN (%)")
    cv.text(8, 8, "REALISED GAIN (%) VS PREDICTED (%), BAND +-3 PP")
    for i, p in enumerate(points):
        col = _PALETTE[i % len(_PALETTE)]
        x, y = 100 * p.predicted, 100 * p.realised
        cv.line(px(100 * p.predicted_ci[0]), py(y), px(100 * p.predicted_ci[1]), py(y), col, 2)
        cv.line(px(x), py(100 * p.realised_ci[0]), px(x), py(100 * p.realised_ci[1]), col, 2)
        cv.rect(px(x) - 5, py(y) - 5, px(x) + 5, py(y) + 5, col)
        cv.text(px(x) + 10, py(y) - 16, p.label, color=col)
    path.write_bytes(cv.png())
