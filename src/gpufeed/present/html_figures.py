"""The building blocks of the HTML report's plotly figures: the shared layout, JSON-safe compact
values and labels escaped for plotly's pseudo-HTML."""

from __future__ import annotations

import html
import json
import math
from typing import Any

import numpy as np

LABELLED_ROWS = 42  # rows of a heatmap that fit 900 px with a label each
_LAYOUT = {
    "margin": {"l": 60, "r": 60, "t": 40, "b": 80},
    "height": 340,
    "font": {"size": 12},
    "paper_bgcolor": "#ffffff",
    "plot_bgcolor": "#ffffff",
    # below the x-axis title, not over it
    "legend": {"orientation": "h", "y": -0.26, "yanchor": "top"},
}


def fig(data: list[dict[str, Any]], title: str, xtitle: str, ytitle: str) -> dict[str, Any]:
    """A plotly figure of `data` in the report's layout, with its title and axis titles."""
    layout = json.loads(json.dumps(_LAYOUT))
    layout |= {
        "title": {"text": title, "x": 0.01, "font": {"size": 14}},
        "xaxis": {"title": {"text": xtitle}},
        "yaxis": {"title": {"text": ytitle}},
    }
    return {"data": data, "layout": layout}


def rows_fig(heatmap: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """A heatmap figure as tall as its rows need, each row labelled in full (up to `LABELLED_ROWS`
    rows; past that plotly picks which to label)."""
    figure = fig(heatmap, title, "seconds", "")
    rows = len(heatmap[0]["y"])
    figure["layout"]["height"] = max(figure["layout"]["height"], min(900, 140 + 18 * rows))
    figure["layout"]["yaxis"] |= {"automargin": True}
    if rows <= LABELLED_ROWS:
        figure["layout"]["yaxis"] |= {"dtick": 1}
    return figure


def clean(values: Any) -> list[float | None]:
    """JSON-safe list: NaN/inf become null, floats keep 4 significant digits to keep the file small."""
    return [
        float(f"{x:.4g}") if math.isfinite(x) else None for x in np.asarray(values, dtype=float)
    ]


def label(text: str) -> str:
    """A run-derived string made safe for plotly, which renders a subset of HTML in labels."""
    return html.escape(text, quote=True)
