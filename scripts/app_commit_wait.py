"""How long an app in another process waits for its commits while the CLI's admin commands run.

An app that writes its orders and their events through the SQL contract (Python's sqlite3,
which re-checks a busy lock only every few milliseconds) commits every 10 ms beside a file
with a big backlog and a long history. Each admin command that reads or rewrites that
backlog or history runs in turn, and this prints, for each, how long the app's slowest
commit waited, its 99th percentile, and how many commits failed with "database is locked".

    cargo build --release -p outbox-cli      # or: cargo build --release --bin outbox
    python3 scripts/app_commit_wait.py --outbox target/release/outbox \
        --pending 2000000 --delivered 500000 --dead 200000

Issue 38 sets the bars: 100 ms behind `stats`, `health` and the relay's gauges, 500 ms
behind `redeliver` and the other admin calls that touch history. The figures go to
docs/PERFORMANCE.md; this is a measurement, not a test (a loaded machine makes it slower).
"""

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def build_file(outbox, db, pending, delivered, dead):
    """A file with `delivered` delivered, `dead` dead and `pending` pending events, written
    through the SQL contract (the enqueue trigger), then marked by hand: the kept totals
    are never folded here, so the first `stats` meets the whole backlog, as a file migrated
    with one does."""
    subprocess.run([outbox, "--db", db, "init"], check=True, stdout=subprocess.DEVNULL)
    conn = sqlite3.connect(db, isolation_level=None)
    total = delivered + dead + pending
    started = time.monotonic()
    step = 100_000
    done = 0
    while done < total:
        n = min(step, total - done)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            """WITH RECURSIVE seq(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM seq WHERE i < ?2)
               INSERT INTO outbox_enqueue (type, data, key)
               SELECT 'order.created', json_object('id', i, 'note', printf('%.200c', 'x')),
                      'customer-' || (i % 1000)
                 FROM seq""",
            (done + 1, done + n),
        )
        conn.execute("COMMIT")
        done += n
    now = int(time.time() * 1000)
    conn.execute("BEGIN IMMEDIATE")
    # The oldest rows become history: delivered over the last week, then dead letters.
    conn.execute(
        "UPDATE outbox_events SET delivered_at = ?1 - (?2 - id) * 1000, attempts = 1 WHERE id <= ?2",
        (now, delivered),
    )
    # Dead letters: the first half two days ago (for purge-dead --older-than 1d), the
    # rest now (for retry --all-dead).
    conn.execute(
        "UPDATE outbox_events SET dead_at = CASE WHEN id <= ?2 + ?3 / 2 THEN ?1 - 172800000"
        " ELSE ?1 END, attempts = 3, last_error = 'HTTP 422' WHERE id > ?2 AND id <= ?2 + ?3",
        (now, delivered, dead),
    )
    conn.execute(
        "INSERT OR REPLACE INTO outbox_delivered_totals (destination, delivered)"
        " VALUES ('default', ?1)",
        (delivered,),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    print(f"built {total:,} rows in {time.monotonic() - started:.1f} s", file=sys.stderr)


class App(threading.Thread):
    """Commits an order and its event every `every_s` until stopped; records each commit's
    time from BEGIN IMMEDIATE to COMMIT's return."""

    def __init__(self, db, every_s):
        super().__init__(name="app", daemon=True)
        self.db, self.every_s = db, every_s
        self.waits, self.locked = [], 0
        self.stop = threading.Event()

    def run(self):
        conn = sqlite3.connect(self.db, timeout=5, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)")
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                conn.execute("BEGIN IMMEDIATE")
                order = conn.execute("INSERT INTO orders (total) VALUES (990)").lastrowid
                conn.execute(
                    "INSERT INTO outbox_enqueue (type, data) VALUES ('order.created', ?)",
                    (json.dumps({"id": order}),),
                )
                conn.execute("COMMIT")
                self.waits.append(time.monotonic() - began)
            except sqlite3.OperationalError:
                self.locked += 1
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            time.sleep(self.every_s)
        conn.close()


def summary(app, took):
    waits = sorted(app.waits)
    return {
        "took_s": took,
        "commits": len(waits),
        "max_ms": waits[-1] * 1000,
        "p99_ms": waits[int(len(waits) * 0.99) - 1] * 1000 if len(waits) >= 100 else None,
        "median_ms": statistics.median(waits) * 1000,
        "locked": app.locked,
    }


def run_beside_app(db, every_s, argv, stop_after=None):
    """Runs one command beside the app (SIGTERM after `stop_after` seconds, for a relay);
    its wall time, peak RSS and the app's commit times."""
    app = App(db, every_s)
    app.start()
    time.sleep(0.5)  # the app's rhythm first
    began = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if stop_after is not None:
        time.sleep(stop_after)
        child.terminate()
    # wait4: this child's own peak RSS (ru_maxrss, KiB on Linux).
    _, status, usage = os.wait4(child.pid, 0)
    took = time.monotonic() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    stderr = child.stderr.read()
    time.sleep(0.5)
    app.stop.set()
    app.join(timeout=30)
    # health exits 1 when degraded, as it is here; a relay stopped by SIGTERM exits 3 or 0.
    if child.returncode not in (0, 1, 3):
        print(stderr, file=sys.stderr)
        raise SystemExit(f"{argv} exited {child.returncode}")
    row = summary(app, took)
    row["rss_mb"] = usage.ru_maxrss / 1024
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outbox", default="target/release/outbox")
    parser.add_argument("--pending", type=int, default=2_000_000)
    parser.add_argument("--delivered", type=int, default=500_000)
    parser.add_argument("--dead", type=int, default=200_000)
    parser.add_argument("--every-ms", type=float, default=10.0)
    parser.add_argument("--dir", default=None, help="where the file goes (default: a temp dir)")
    args = parser.parse_args()
    every_s = args.every_ms / 1000
    outbox = os.path.abspath(args.outbox)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        db = os.path.join(tmp, "app.db")
        build_file(outbox, db, args.pending, args.delivered, args.dead)
        base = [outbox, "--db", db]
        # A relay to a receiver that is not there: it claims, finds the destination down,
        # and (built with the metrics feature) refreshes its gauges every 10 s, which count
        # the unfolded backlog in a read transaction.
        relay = base + ["relay", "--url", "http://127.0.0.1:9/"]
        steps = [
            ("(no command: the app alone)", ["sleep", "3"], None),
            ("relay, receiver down (25 s)", relay, 25),
            ("stats (the first: folds the whole backlog)", base + ["stats"], None),
            ("stats (again)", base + ["stats"], None),
            ("health", base + ["health"], None),
            (f"redeliver --destination default ({args.delivered:,} delivered)",
             base + ["redeliver", "--destination", "default"], None),
            (f"purge-dead --older-than 1d ({args.dead // 2:,} dead)",
             base + ["purge-dead", "--older-than", "1d"], None),
            (f"retry --all-dead ({args.dead - args.dead // 2:,} dead)",
             base + ["retry", "--all-dead"], None),
            ("prune --older-than 0s", base + ["prune", "--older-than", "0s"], None),
        ]
        rows = []
        for name, argv, stop_after in steps:
            print(f"running {name}", file=sys.stderr)
            rows.append((name, run_beside_app(db, every_s, argv, stop_after)))

    print(f"| command beside the app (commits every {args.every_ms:g} ms) | took | "
          "app commits | median | p99 | max | locked | command RSS |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for name, r in rows:
        p99 = f"{r['p99_ms']:.1f} ms" if r["p99_ms"] is not None else "-"
        rss = f"{r['rss_mb']:.0f} MB" if not name.startswith("(") else "-"
        print(f"| {name} | {r['took_s']:.1f} s | {r['commits']} | {r['median_ms']:.1f} ms | "
              f"{p99} | {r['max_ms']:.1f} ms | {r['locked']} | {rss} |")


if __name__ == "__main__":
    main()
