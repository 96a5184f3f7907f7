"""The panel's pyqtgraph plots share one look: made for reading, not for exploring."""

from __future__ import annotations

import pyqtgraph as pg


def quiet_plot(height: int) -> pg.PlotWidget:
    """A plot without mouse zoom, context menu or auto-range button, ``height`` pixels high."""
    plot = pg.PlotWidget(background=None)  # the panel's own background, light or dark
    plot.setMenuEnabled(False)
    plot.setMouseEnabled(x=False, y=False)
    plot.hideButtons()
    plot.setFixedHeight(height)
    return plot
