"""One way to draw a figure and encode it as PNG, shared by every plot the toolkit makes.

matplotlib's object-oriented API on the non-interactive Agg canvas, imported on first use: no
pyplot, no global backend switch, nothing paid by code that never plots. PNGs carry no
``Software`` text chunk, so the same data renders to the same bytes on one matplotlib.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from dspark_calibrate.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.figure import Figure

__all__ = ["RAW_COLOR", "new_figure", "png_bytes"]

#: The colour of uncalibrated (raw-logit) series, in the fit's plots and the report's alike.
RAW_COLOR = "#9a9a9a"


def new_figure(width: float, height: float, *, dpi: float = 100, what: str, skip_flag: str) -> Figure:
    """A figure of ``width`` x ``height`` inches on an Agg canvas.

    Args:
        width: inches.
        height: inches.
        dpi: raster resolution used when encoding.
        what: the plot, for the error message (e.g. "the sweep plot").
        skip_flag: the command-line flag that skips it (e.g. "--no-plot").

    Raises:
        ConfigError: matplotlib is not installed; the message says how to install it or skip.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ConfigError(
            f"{what}: matplotlib is not installed; install the 'plots' extra or pass {skip_flag}"
        ) from exc
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes at its own dpi, without the ``Software`` stamp."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi="figure", metadata={"Software": None})
    return buf.getvalue()
