"""`bench compare a.json b.json ...`: several runs (engines, settings) in one table and one plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoglm_serve.bench.plots import plot_latency_throughput
from autoglm_serve.bench.report import load_result, markdown_rows, point_row, table_header


def compare_table(runs: list[dict[str, Any]]) -> str:
    points = [p for r in runs for p in r["points"]]
    show_goodput = any(p["summary"].get("goodput") is not None for p in points)
    show_agent = any(p.get("phone_agent") for p in points)
    header = ["run", "dataset"] + table_header(show_goodput, show_agent)
    rows = [
        [r.get("label", ""), str(r.get("dataset", ""))] + point_row(p, show_goodput, show_agent)
        for r in runs for p in r["points"]
    ]
    notes = []
    for r in runs:
        gpu = r.get("gpu") or {}
        if not gpu.get("available"):
            notes.append(f"- {r.get('label')}: GPU not measured ({gpu.get('note') or 'no GPU'})")
    return markdown_rows(header, rows) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def compare(paths: list[str | Path], out_dir: str | Path) -> tuple[str, Path]:
    """Print-ready table and the path of the combined plot, written to `out_dir`."""
    runs = [load_result(p) for p in paths]
    labels = [r["label"] for r in runs]
    # Same label twice (e.g. two runs of one model name): number them so legends stay readable.
    for i, r in enumerate(runs):
        if labels.count(r["label"]) > 1:
            r["label"] = f"{r['label']} #{i + 1}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = compare_table(runs)
    (out / "compare.md").write_text(table)
    png = plot_latency_throughput(runs, out / "compare.png", title="comparison")
    return table, png
