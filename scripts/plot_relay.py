"""Plots relay throughput against worker count and batch size.

    cargo run --release --example bench -- sweep > docs/relay-sweep.csv
    python3 scripts/plot_relay.py docs/relay-sweep.csv docs/relay-throughput.png

Needs matplotlib (pip install matplotlib). Not part of CI.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src, out = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(src)))
fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
for batch in sorted({int(r["batch"]) for r in rows}):
    pts = sorted(
        (int(r["workers"]), float(r["events_per_second"]) / 1000)
        for r in rows
        if int(r["batch"]) == batch
    )
    label = "1 event per request" if batch == 1 else f"batches of {batch}"
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
ax.set_xlabel("delivery workers (connections)")
ax.set_ylabel("events delivered per second (thousands)")
ax.set_yscale("log")
ax.set_xticks(sorted({int(r["workers"]) for r in rows}))
ax.grid(True, which="both", alpha=0.3)
ax.set_title("sqlite-outbox relay to a local receiver, 2-core VM")
ax.legend()
fig.tight_layout()
fig.savefig(out)
print(f"wrote {out}")
