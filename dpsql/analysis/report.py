"""The HTML fidelity report of ``dpsql evaluate``: figures and tables (not DP: admins only).

Figures (PNG, also embedded in the HTML so one file can be shared with the
data owner): a log-log scatter of true vs synthetic crosstab counts coloured
by cell size, next to the bootstrap ideal (MODP's Figures 1 and 4); |z|
against d with the figure-of-merit contours (MODP's Figure 7); and a bar chart
per column of true vs synthetic shares.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpsql.analysis.fidelity import D0, PSEUDOCOUNT, Z0, Evaluation, Fidelity
from dpsql.files import private_folder, write_private

FIGURE_FILES = {"scatter": "crosstab_scatter.png", "merit": "figure_of_merit.png",
                "columns": "columns.png"}
METRICS = (("median_d", "median log discrepancy d"), ("mean_d", "mean d"),
           ("rms_d", "r.m.s. d"), ("median_z", "median |z|"), ("mean_z", "mean |z|"),
           ("median_fm", "median figure of merit"), ("mean_fm", "mean figure of merit"),
           ("workload_error", "workload error (2-way, half L1)"))


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as err:  # pragma: no cover - depends on the environment
        from dpsql.errors import ConfigurationError

        raise ConfigurationError("the HTML report needs matplotlib: pip install "
                                 "'dpsql[report]' (or pass --no-report)") from err
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _scatter_panel(ax: Any, fidelity: Fidelity, title: str, norm: Any) -> Any:
    true = fidelity.true + PSEUDOCOUNT
    synthetic = fidelity.synthetic + PSEUDOCOUNT
    order = np.argsort(true)
    points = ax.scatter(true[order], synthetic[order], c=true[order], cmap="coolwarm",
                        norm=norm, s=6, alpha=0.7, linewidths=0)
    top = max(true.max(), synthetic.max()) * 1.5
    ax.plot([1, top], [1, top], color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.8, top)
    ax.set_ylim(0.8, top)
    ax.set_xlabel(f"true count + {PSEUDOCOUNT:g}")
    ax.set_ylabel(f"synthetic count + {PSEUDOCOUNT:g}")
    summary = fidelity.summary()
    ax.set_title(f"{title}\nmedian d = {summary['median_d']:.3f}, "
                 f"workload error = {summary['workload_error']:.3f}", fontsize=10)
    ax.set_aspect("equal")
    return points


def scatter_figure(evaluation: Evaluation) -> bytes:
    """True vs synthetic crosstab counts, log-log, coloured by cell size; ideal alongside (PNG)."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm

    norm = LogNorm(vmin=PSEUDOCOUNT, vmax=max(evaluation.synthetic.true.max() + PSEUDOCOUNT, 10))
    figure, axes = plt.subplots(1, 2, figsize=(11, 5.8), constrained_layout=True)
    _scatter_panel(axes[0], evaluation.synthetic, f"release {evaluation.name}", norm)
    points = _scatter_panel(axes[1], evaluation.ideal, "bootstrap resample (ideal)", norm)
    figure.colorbar(points, ax=axes, label="true count + 1 (cell size)", shrink=0.85)
    figure.suptitle(f"{evaluation.synthetic.d.size:,} cells of all 1-way and 2-way crosstabs")
    return _png(plt, figure, 110)


def merit_figure(evaluation: Evaluation) -> bytes:
    """|z| against d per cell with the figure-of-merit contours 1, 2 and 4 (MODP Fig. 7; PNG)."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm

    fidelity = evaluation.synthetic
    figure, ax = plt.subplots(figsize=(6.4, 5.2), constrained_layout=True)
    order = np.argsort(fidelity.true)
    points = ax.scatter(fidelity.d[order], np.abs(fidelity.z[order]),
                        c=fidelity.true[order] + PSEUDOCOUNT, cmap="coolwarm",
                        norm=LogNorm(vmin=PSEUDOCOUNT, vmax=max(fidelity.true.max() + 1, 10)),
                        s=6, alpha=0.7, linewidths=0)
    d_top = max(float(np.quantile(fidelity.d, 0.99)) * 1.2, 4 * D0)
    z_top = max(float(np.quantile(np.abs(fidelity.z), 0.99)) * 1.2, 4 * Z0)
    for level in (1, 2, 4):
        # fm = level  <=>  z0/|z| = 2/level - d0/d
        d = np.linspace(level * D0 / 2 * 1.0001, d_top, 400)
        z = Z0 / (2 / level - D0 / d)
        ax.plot(d, z, color="black", linewidth=0.7)
        ax.annotate(f"f.m. {level}", (d[-1], z[-1]), fontsize=8, ha="right", va="bottom")
    ax.set_xlim(0, d_top)
    ax.set_ylim(0, z_top)
    ax.set_xlabel("log discrepancy d")
    ax.set_ylabel("|z|")
    ax.set_title(f"release {evaluation.name}: accuracy per crosstab cell", fontsize=10)
    figure.colorbar(points, ax=ax, label="true count + 1")
    return _png(plt, figure, 110)


def columns_figure(evaluation: Evaluation) -> bytes:
    """One bar chart per column: true vs synthetic share of each code (PNG)."""
    plt = _pyplot()
    attributes = evaluation.domain.attributes
    ncols = min(3, len(attributes))
    nrows = math.ceil(len(attributes) / ncols)
    figure, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.0 * nrows),
                                constrained_layout=True, squeeze=False)
    for index, attribute in enumerate(attributes):
        ax = axes[index // ncols][index % ncols]
        true = evaluation.true_tables[(index,)].astype(float)
        synthetic = evaluation.synthetic_tables[(index,)].astype(float)
        true = true / true.sum() if true.sum() else true
        synthetic = synthetic / synthetic.sum() if synthetic.sum() else synthetic
        x = np.arange(attribute.size)
        width = 0.42
        ax.bar(x - width / 2, true, width, label="true", color="#4c72b0")
        ax.bar(x + width / 2, synthetic, width, label="synthetic", color="#dd8452")
        labels = attribute.labels()
        if attribute.size <= 12:
            ax.set_xticks(x, [label[:10] for label in labels], rotation=45, ha="right",
                          fontsize=7)
        else:
            step = math.ceil(attribute.size / 10)
            ax.set_xticks(x[::step], [labels[i][:10] for i in x[::step]], rotation=45,
                          ha="right", fontsize=7)
        ax.set_title(attribute.name, fontsize=10)
        ax.set_ylabel("share", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        if index == 0:
            ax.legend(fontsize=8)
    for index in range(len(attributes), nrows * ncols):
        axes[index // ncols][index % ncols].axis("off")
    return _png(plt, figure, 100)


def _image(png: bytes, name: str, alt: str) -> str:
    data = base64.b64encode(png).decode()
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(alt)} ({html.escape(name)})</figcaption></figure>")


def _png(plt: Any, figure: Any, dpi: int) -> bytes:
    """The figure as PNG bytes (then closed)."""
    png = io.BytesIO()
    figure.savefig(png, dpi=dpi, format="png")
    plt.close(figure)
    return png.getvalue()


@dataclass(frozen=True)
class Report:
    """The HTML report (figures embedded) and each figure's PNG, by file name."""

    html: str
    figures: dict[str, bytes]


def render_report(evaluation: Evaluation) -> Report:
    """The report of ``evaluation`` in memory: nothing is written (not DP: admins only)."""
    figures = {"crosstab_scatter.png": scatter_figure(evaluation),
               "figure_of_merit.png": merit_figure(evaluation),
               "columns.png": columns_figure(evaluation)}
    synthetic, ideal = evaluation.synthetic.summary(), evaluation.ideal.summary()
    rows = "".join(
        f"<tr><td>{html.escape(label)}</td><td>{synthetic[key]:.4f}</td>"
        f"<td>{ideal[key]:.4f}</td></tr>" for key, label in METRICS)
    record = evaluation.record
    cost = record.get("cost", {}).get("charged", {})
    facts = [
        ("release", f"released.{evaluation.name} ({record['release_id']})"),
        ("dataset", record["dataset"]["name"]),
        ("synthesizer", record["synthesizer"]["name"]),
        ("privacy", record["privacy"]),
        ("cost charged", ", ".join(f"{k}={v}" for k, v in cost.items() if k != "kind")),
        ("columns", ", ".join(record["columns"])),
        ("rows (this copy / true)",
         f"{evaluation.synthetic.rows_synthetic:,} / {evaluation.synthetic.rows_true:,}"),
        ("copy", str(evaluation.copy or 1)),
        ("cells scored", f"{int(synthetic['cells']):,} (all 1-way and 2-way crosstabs)"),
    ]
    fact_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                        for k, v in facts)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>dpsql fidelity report: {html.escape(evaluation.name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1150px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; }}
td:nth-child(n+2) {{ text-align: right; font-variant-numeric: tabular-nums; }}
.warning {{ background: #fff3cd; border: 1px solid #e0c36a; padding: 0.6em 1em; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>Fidelity of released.{html.escape(evaluation.name)}</h1>
<p class="warning"><strong>Not differentially private.</strong> Every figure and number here
is computed from the real data; keep this report with the data owner.</p>
<table>{fact_rows}</table>
<h2>Crosstab accuracy</h2>
<p>Each cell of every 1-way and 2-way crosstab is scored by the log discrepancy
d = |log((C<sub>syn</sub> + {PSEUDOCOUNT:g}) / (C<sub>true</sub> + {PSEUDOCOUNT:g}))|, the
two-proportion z statistic, and the blended figure of merit 2 / (d<sub>0</sub>/|d| +
z<sub>0</sub>/|z|) with d<sub>0</sub> = {D0:g}, z<sub>0</sub> = {Z0:g} (Rodriguez &amp; Press,
MODP, sec. 5). The bootstrap ideal is a resample of the real rows scored the same way.</p>
<table><tr><th>measure</th><th>release</th><th>bootstrap ideal</th></tr>{rows}</table>
{_figure(figures, "crosstab_scatter.png", "True vs synthetic crosstab counts")}
{_figure(figures, "figure_of_merit.png",
         "Log discrepancy and |z| per cell, with figure-of-merit contours")}
<h2>Columns</h2>
{_figure(figures, "columns.png", "Share of each code, true vs synthetic")}
</body></html>
"""
    return Report(page, figures)


def _figure(figures: dict[str, bytes], name: str, alt: str) -> str:
    return _image(figures[name], name, alt)


def write_report(evaluation: Evaluation, directory: str | Path) -> dict[str, Path]:
    """Write ``report.html`` and its PNG figures into ``directory``; returns their paths.

    Not DP: the folder and its files are the owner's only (:mod:`dpsql.files`).
    """
    return write_report_files(render_report(evaluation), directory)


def write_report_files(report: Report, directory: str | Path) -> dict[str, Path]:
    """Write a rendered report's HTML and figures into ``directory`` (the owner's only).

    Returns the paths by kind: ``scatter``, ``merit``, ``columns`` and ``html``.
    """
    out = private_folder(Path(directory))
    paths = {}
    for kind, name in FIGURE_FILES.items():
        paths[kind] = out / name
        write_private(paths[kind], report.figures[name])
    paths["html"] = out / "report.html"
    write_private(paths["html"], report.html)
    return paths
