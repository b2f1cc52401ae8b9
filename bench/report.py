"""``REPORT.md`` and its PNG plots, built from the benchmarks' JSON reports.

Everything here reads only the reports (through each module's optional
``tables``, ``plots`` and ``targets``; see ``common.py``), so ``run.py
--report-only`` can rebuild the markdown and the plots from the JSON files
of an earlier run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from common import Plot, Target, format_ratio, format_table

REPORT_NAME = "REPORT.md"
SUMMARY_NAME = "summary.json"
# Small PNGs: PLOT_SIZE_INCHES at PLOT_DPI makes 512 x 288 pixels, a few tens of KB.
PLOT_SIZE_INCHES = (6.4, 3.6)
PLOT_DPI = 80


def contribution(module: ModuleType, name: str, report: dict[str, Any]) -> list[Any] | None:
    """What the module's optional ``tables``, ``plots`` or ``targets`` (``name``)
    makes of ``report``; ``None`` when the module does not define it."""
    make = getattr(module, name, None)
    return None if make is None else list(make(report))


def plot_file_name(benchmark: str, plot: Plot) -> str:
    return f"{benchmark}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', plot.name)}.png"


def draw_plot(plot: Plot, path: Path) -> None:
    """Draw ``plot`` into a PNG at ``path`` (Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    figure, axes = pyplot.subplots(figsize=PLOT_SIZE_INCHES, dpi=PLOT_DPI)
    try:
        if plot.kind == "bar":
            _draw_bars(axes, plot)
        else:
            for label, values in plot.series.items():
                points = [(x, y) for x, y in zip(plot.x, values, strict=False) if y is not None]
                if points:
                    axes.plot(*zip(*points, strict=True), marker="o", label=label)
            if all(isinstance(x, (int, float)) for x in plot.x):
                axes.set_xticks(plot.x)
        if plot.log_y:
            axes.set_yscale("log")
            # Labels at 1, 2 and 5 of each decade: data within one decade still gets some.
            axes.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axes.yaxis.set_minor_formatter(NullFormatter())
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: _tick_label(value)))
        axes.set_title(plot.title, fontsize=10)
        axes.set_xlabel(plot.x_label)
        axes.set_ylabel(plot.y_label)
        axes.grid(True, which="major", alpha=0.3)
        axes.legend(fontsize=7)
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=PLOT_DPI)
    finally:
        pyplot.close(figure)


def _tick_label(value: float) -> str:
    """Thousands separated, with up to two decimals where the ticks need them
    (a narrow axis, e.g. 49.5 to 52 MiB, would otherwise label 50 twice)."""
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def _draw_bars(axes: Any, plot: Plot) -> None:
    count = max(len(plot.series), 1)
    width = 0.8 / count
    for number, (label, values) in enumerate(plot.series.items()):
        offsets = [i + (number - (count - 1) / 2) * width for i in range(len(plot.x))]
        heights = [0.0 if v is None else v for v in values]
        axes.bar(offsets, heights, width=width, label=label)
    axes.set_xticks(range(len(plot.x)))
    axes.set_xticklabels([str(x) for x in plot.x])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; the first column left-aligned, the others right."""

    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    rule = "|" + "|".join([" --- "] + [" ---: "] * (len(headers) - 1)) + "|"
    return "\n".join([line(headers), rule] + [line(row) for row in rows])


def target_rows(targets: Sequence[Target]) -> list[list[str]]:
    """The rows of the targets table: name, measured, target, verdict."""
    rows = []
    for target in targets:
        measured = "-" if target.measured is None else f"{format_ratio(target.measured)}x"
        verdict = {None: "not measured", True: "met", False: "NOT met"}[target.met]
        rows.append([target.name, measured, f">= {target.target:g}x", verdict])
    return rows


TARGET_HEADERS = ["target", "measured", "target ratio", "verdict"]


def not_met_lines(targets: Sequence[Target]) -> list[str]:
    """Markdown lines under a targets table: each target NOT met, with
    what bounds it (``Target.why``); none when every target is met."""
    missed = [target for target in targets if target.met is False]
    if not missed:
        return []
    lines = ["Not met, and why:", ""]
    for target in missed:
        why = target.why or "no reason written yet."
        lines.append(
            f"- *{target.name}* ({format_ratio(target.measured)}x, needs >= {target.target:g}x): "
            + why
        )
    return [*lines, ""]


def format_targets_table(targets: Sequence[Target]) -> str:
    """The targets of every benchmark as a plain-text table, for the terminal."""
    return "Targets (measured ratio vs target)\n\n" + format_table(
        TARGET_HEADERS, target_rows(targets)
    )


def write_report(
    out: Path, modules: Sequence[ModuleType], reports: dict[str, dict[str, Any]]
) -> tuple[Path, list[Path], list[Target]]:
    """Write ``REPORT.md`` and the PNGs of ``reports`` (``{NAME: report}``, in
    the order of ``modules``) into ``out``; return the markdown's path, the
    PNGs written and every target."""
    sections: list[str] = []
    pictures: list[Path] = []
    every_target: list[Target] = []
    for module in modules:
        report = reports.get(module.NAME)
        if report is None:
            continue
        section = [f"## {module.NAME}", ""]
        summary = (module.__doc__ or "").strip().split("\n\n")[0]
        if summary:
            section += [" ".join(summary.split()), ""]
        if report.get("machine"):
            section += [_measured_on(report["machine"]), ""]
        try:
            body, targets, plots = _section_body(out, module, report)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            # A JSON file left by an older version of the benchmark: say so, keep going.
            body, targets, plots = [f"Could not read `{module.NAME}.json`: {error!r}.", ""], [], []
        section += body
        every_target.extend(targets)
        pictures.extend(plots)
        section.append(f"Raw numbers: [`{module.NAME}.json`]({module.NAME}.json).")
        sections.append("\n".join(section))

    header = [
        "# percolite benchmarks",
        "",
        "Written by `bench/run.py` (`make bench`); see `bench/README.md` for the method. "
        "Every ratio compares systems measured side by side in one run; numbers are medians "
        "of repeated runs. Each section says when, at which revision and by which command "
        "it was measured.",
        "",
    ]
    header += [
        "## Targets",
        "",
        markdown_table(TARGET_HEADERS, target_rows(every_target))
        if every_target
        else "No benchmark with a target was run.",
        "",
        *not_met_lines(every_target),
    ]
    path = out / REPORT_NAME
    out.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header) + "\n" + "\n\n".join(sections) + "\n", encoding="utf-8")
    return path, pictures, every_target


def _section_body(
    out: Path, module: ModuleType, report: dict[str, Any]
) -> tuple[list[str], list[Target], list[Path]]:
    """A benchmark's tables, plots and targets as markdown lines; draws the
    plots into ``out``."""
    lines: list[str] = []
    tables = contribution(module, "tables", report)
    if tables is None:
        lines += ["```", module.format_report(report), "```", ""]
    else:
        for table in tables:
            lines += [f"**{table.title}**", "", markdown_table(table.headers, table.rows), ""]
            lines += [note + "\n" for note in table.notes]
    pictures = []
    for plot in contribution(module, "plots", report) or []:
        name = plot_file_name(module.NAME, plot)
        draw_plot(plot, out / name)
        pictures.append(out / name)
        lines += [f"![{plot.title}]({name})", ""]
    targets = contribution(module, "targets", report) or []
    if targets:
        lines += [markdown_table(TARGET_HEADERS, target_rows(targets)), ""]
        lines += not_met_lines(targets)
    return lines, targets, pictures


def _measured_on(machine: dict[str, Any]) -> str:
    load = machine.get("load_average")
    load_text = "-" if not load else " / ".join(f"{value:.1f}" for value in load)
    return (
        f"Measured {machine.get('time_utc')} at git `{machine.get('git')}` on "
        f"{machine.get('cpus')} CPUs ({machine.get('platform')}, Python "
        f"{machine.get('python')}); load average at the start {load_text}."
        + (f" Command: `{machine['command']}`." if machine.get("command") else "")
    )
