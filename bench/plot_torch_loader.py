#!/usr/bin/env python3
"""Plots samples/s against processes, written with the standard library only:
- from the CSVs bench/torch_loader.py writes: torch's DataLoader (at each worker count, the
  configuration with the best median over the runs) and pinring.torch.DataLoader (its median);
- from images_sweep.csv of bench/images.py: images/s against loader processes, torch's
  DataLoader with PIL workers and pinring's Rust loaders.

Usage: plot_torch_loader.py CSV [CSV ...]   (writes CSV's name with .svg beside each)
"""

import csv
import statistics
import sys

W, H, L, R, T, B = 520, 320, 70, 170, 40, 50
COLORS = {"torch": "#d62728", "pinring": "#1f77b4", "torch-pil": "#d62728"}
LABELS = {"torch": "torch DataLoader (best)", "pinring": "pinring.torch",
          "torch-pil": "DataLoader, PIL workers"}


def best_per_workers(rows, loader):
    """{workers: best over configurations of the median over runs}."""
    runs = {}
    for r in rows:
        if r["loader"] != loader:
            continue
        key = (int(r["workers"]), r.get("pin"), r.get("prefetch"))
        runs.setdefault(key, []).append(float(r["samples_per_s"]))
    best = {}
    for (w, _, _), vs in runs.items():
        best[w] = max(best.get(w, 0.0), statistics.median(vs))
    return sorted(best.items())


def plot(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if "case" in rows[0]:
        case, xlabel = rows[0]["case"], "workers"
        names = ["torch", "pinring"]
    else:  # images_sweep.csv
        case, xlabel = "JPEG decode + RandomResizedCrop(224)", "loader processes"
        names = ["torch-pil", "pinring"]
        rows = [dict(r, workers=r["procs"]) for r in rows]
    LABELS["pinring"] = "pinring.torch" if "case" in rows[0] else "pinring-loader (Rust)"
    series = {name: best_per_workers(rows, name) for name in names}
    xs = sorted({w for s in series.values() for w, _ in s})
    ymax = max(v for s in series.values() for _, v in s) * 1.1
    x0, x1 = min(xs), max(xs)

    def px(w):
        return L + (w - x0) / max(1, x1 - x0) * (W - L - R)

    def py(v):
        return H - B - v / ymax * (H - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="20" font-size="14">{case}: samples/s against {xlabel} '
           '(H200 host)</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for w in xs:
        out.append(f'<text x="{px(w):.1f}" y="{H - B + 16}" text-anchor="middle">{w}</text>')
    out.append(f'<text x="{(L + W - R) / 2:.1f}" y="{H - 12}" text-anchor="middle">{xlabel}</text>')
    for i in range(6):
        v = ymax / 1.1 * i / 5
        out.append(f'<text x="{L - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
        out.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" '
                   'stroke="#ddd"/>')
    for k, (name, pts) in enumerate(series.items()):
        c = COLORS[name]
        line = " ".join(f"{px(w):.1f},{py(v):.1f}" for w, v in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="2"/>')
        for w, v in pts:
            out.append(f'<circle cx="{px(w):.1f}" cy="{py(v):.1f}" r="4" fill="{c}"/>')
        out.append(f'<text x="{W - R + 10}" y="{T + 20 + 18 * k}" fill="{c}">{LABELS[name]}</text>')
    out.append("</svg>")
    svg = path.rsplit(".", 1)[0] + ".svg"
    with open(svg, "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote", svg)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        plot(p)
