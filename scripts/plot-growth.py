#!/usr/bin/env python3
"""Draws the growth curve (proxy CPU per turn over one long rollout) as an SVG.

    scripts/plot-growth.py OUT.svg RUN.txt [RUN.txt ...] [--render TURN:MS,...]

Each RUN.txt holds the growth lines `cargo bench --bench load` prints
("  turn  128    74255 tokens     2.087 ms  (8.6x turn 1)"); each becomes one series, named
after its file (growth-tail-1.txt: "tail-1"). The goal
(3x the first run's turn 1) is drawn as a dashed line. `--render` adds the floor an exact
render sets: the first run's turn 1 plus the growth of the template's render alone (the
`render_history` bench's medians at those turns), e.g. `--render 1:0.0073,32:0.122,128:0.567`.
Standard library only, so it runs wherever the benches do.
"""

import math
import re
import sys

GROWTH_LINE = re.compile(r"turn\s+(\d+)\s+(\d+) tokens\s+([\d.]+) ms")
WIDTH, HEIGHT = 780, 420
LEFT, RIGHT, TOP, BOTTOM = 60, 240, 40, 60
COLOURS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]


def read_run(path):
    """[(turn, tokens, ms)] from one run's output."""
    with open(path) as f:
        rows = [GROWTH_LINE.search(line) for line in f]
    points = [(int(m[1]), int(m[2]), float(m[3])) for m in rows if m]
    if not points:
        sys.exit(f"{path}: no growth lines (run `cargo bench --bench load`)")
    return points


def parse_render(text):
    pairs = (item.split(":") for item in text.split(","))
    return sorted((int(turn), float(ms)) for turn, ms in pairs)


def main(argv):
    render = None
    if "--render" in argv:
        at = argv.index("--render")
        render = parse_render(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    if len(argv) < 2:
        sys.exit(__doc__)
    out, runs = argv[0], [read_run(path) for path in argv[1:]]
    # Each series is named after its file: growth-tail-1.txt is "tail-1".
    names = [path.rsplit("/", 1)[-1].removesuffix(".txt").removeprefix("growth-") for path in argv[1:]]

    first = runs[0][0][2]
    goal = 3 * first
    floor = [(turn, first + ms - render[0][1]) for turn, ms in render] if render else []
    last_turn = max(p[0] for run in runs for p in run)
    top_ms = max([goal] + [p[2] for run in runs for p in run] + [ms for _, ms in floor]) * 1.1

    def x(turn):
        return LEFT + (WIDTH - LEFT - RIGHT) * math.log2(turn) / math.log2(last_turn)

    def y(ms):
        return HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * ms / top_ms

    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14">Proxy CPU per turn over one rollout '
        "(ms; turn axis doubling)</text>",
    ]
    step = 0.5 if top_ms > 1.5 else 0.25
    for i in range(int(top_ms / step) + 1):
        ms = i * step
        svg.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(ms):.1f}" y2="{y(ms):.1f}" '
                   'stroke="#ddd"/>')
        svg.append(f'<text x="{LEFT - 8}" y="{y(ms) + 4:.1f}" text-anchor="end">{ms:g}</text>')
    for turn, tokens, _ in runs[0]:
        svg.append(f'<text x="{x(turn):.1f}" y="{HEIGHT - BOTTOM + 18}" '
                   f'text-anchor="middle">{turn}</text>')
        svg.append(f'<text x="{x(turn):.1f}" y="{HEIGHT - BOTTOM + 32}" text-anchor="middle" '
                   f'fill="#666" font-size="10">{tokens / 1000:.1f}k</text>')
    svg.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 10}" text-anchor="middle">'
               "turn (prompt tokens below)</text>")

    legend = []
    svg.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(goal):.1f}" y2="{y(goal):.1f}" '
               'stroke="#d62728" stroke-dasharray="6 4"/>')
    legend.append(("#d62728", "6 4", f"goal: 3x turn 1 ({goal:.2f} ms)"))
    def series(points, colour, style):
        """A line through `points` [(turn, ms)] with a dot on each."""
        path = " ".join(f"{x(t):.1f},{y(ms):.1f}" for t, ms in points)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{colour}" {style}/>')
        for t, ms in points:
            svg.append(f'<circle cx="{x(t):.1f}" cy="{y(ms):.1f}" r="3" fill="{colour}"/>')

    if floor:
        series(floor, "#ff7f0e", 'stroke-dasharray="2 3"')
        legend.append(("#ff7f0e", "2 3", "turn 1 + exact render's growth"))
    for n, run in enumerate(runs):
        colour = COLOURS[n % len(COLOURS)]
        series([(t, ms) for t, _, ms in run], colour, 'stroke-width="2"')
        end = run[-1]
        name = names[n]
        legend.append((colour, "", f"{name}: turn {end[0]} = {end[2] / run[0][2]:.1f}x turn 1"))

    for i, (colour, dash, label) in enumerate(legend):
        ly = TOP + 10 + 20 * i
        lx = WIDTH - RIGHT + 12
        svg.append(f'<line x1="{lx}" x2="{lx + 22}" y1="{ly}" y2="{ly}" stroke="{colour}" '
                   f'stroke-width="2" stroke-dasharray="{dash}"/>')
        svg.append(f'<text x="{lx + 28}" y="{ly + 4}" font-size="11">{label}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
