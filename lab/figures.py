"""
What nanonorm's figures share: matplotlib drawing into files only (the Agg backend, no display needed), PNGs written
whole or not at all, a log-x LR axis and a legend beside the axes. plot.py, the results page (lab/results_page.py)
and the coord check's figure (lab/coord_check.py) draw through it.
"""

import io
import os

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from engine import files  # noqa: E402

FP16_MAX = 65504.0  # float16's largest value: the first op past it is the failed one (NormFormer arXiv v1 §4)


def save_png(fig, path, **options):
    """fig as a PNG at path, whole or not at all (files.write_atomic); a failed write is a files.WriteError."""
    picture = io.BytesIO()
    fig.savefig(picture, format="png", **options)
    plt.close(fig)
    files.write_atomic(path, picture.getvalue())


def make_folder(path):
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise files.cannot_write(path, e) from None


def legend_outside(ax):
    """The legend to the right of the axes; none where nothing drawn has a label (a figure with no data)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def log_lr_axis(ax, label):
    """A log-x LR axis labeled at 1, 2 and 5 times the powers of ten, as plain numbers."""
    ax.set(xscale="log", xlabel=label)
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
