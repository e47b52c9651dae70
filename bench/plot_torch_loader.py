#!/usr/bin/env python3
"""Plots samples/s against workers for torch's DataLoader (its best configuration at each
worker count) and pinring.torch.DataLoader, from the CSVs bench/torch_loader.py writes: one
SVG per case, written with the standard library only.

Usage: plot_torch_loader.py CSV [CSV ...]   (writes CSV's name with .svg beside each)
"""

import csv
import sys

W, H, L, R, T, B = 520, 320, 70, 140, 40, 50
COLORS = {"torch": "#d62728", "pinring": "#1f77b4"}


def best_per_workers(rows, loader):
    best = {}
    for r in rows:
        if r["loader"] != loader:
            continue
        w, v = int(r["workers"]), float(r["samples_per_s"])
        best[w] = max(best.get(w, 0.0), v)
    return sorted(best.items())


def plot(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    case = rows[0]["case"]
    series = {name: best_per_workers(rows, name) for name in COLORS}
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
           f'<text x="{L}" y="20" font-size="14">{case}: samples/s against workers '
           '(H200 host)</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for w in xs:
        out.append(f'<text x="{px(w):.1f}" y="{H - B + 16}" text-anchor="middle">{w}</text>')
    out.append(f'<text x="{(L + W - R) / 2:.1f}" y="{H - 12}" text-anchor="middle">workers</text>')
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
        label = "torch DataLoader (best)" if name == "torch" else "pinring.torch"
        out.append(f'<text x="{W - R + 10}" y="{T + 20 + 18 * k}" fill="{c}">{label}</text>')
    out.append("</svg>")
    svg = path.rsplit(".", 1)[0] + ".svg"
    with open(svg, "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote", svg)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        plot(p)
