"""An app in Python writing to an outbox file, as a gateway would: each order and the event
that announces it in one transaction of its own, through the SQL contract
(`INSERT INTO outbox_enqueue`), with only the standard library's sqlite3.

Usage: writer.py DB ORDERS ROLLBACK_EVERY
Prints one JSON object: the orders committed and rolled back, the errors of refused
inserts, and the event id read back by an idempotency key.
"""

import json
import sqlite3
import sys


def main(db, orders, rollback_every):
    # isolation_level=None: transactions are begun explicitly, as BEGIN IMMEDIATE (a writer
    # that takes the lock up front waits for it instead of failing half-way).
    conn = sqlite3.connect(db, timeout=10, isolation_level=None)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, lang TEXT, n INTEGER)"
    )
    report = {"sqlite": sqlite3.sqlite_version, "committed": [], "rolled_back": [], "refused": []}
    for n in range(orders):
        order = f"py-{n}"
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (id, lang, n) VALUES (?, 'python', ?)", (order, n))
        conn.execute(
            "INSERT INTO outbox_enqueue (type, data, key, idempotency_key) VALUES (?, ?, ?, ?)",
            ("order.created", json.dumps({"order": order, "n": n}), f"py-key-{n % 5}", order),
        )
        # A repeat of the idempotency key is no error and adds nothing.
        conn.execute(
            "INSERT INTO outbox_enqueue (type, data, idempotency_key) VALUES (?, ?, ?)",
            ("order.created", json.dumps({"order": order, "repeat": True}), order),
        )
        if n % 7 == 3:
            # A bad event fails its own statement only: the transaction goes on.
            try:
                conn.execute("INSERT INTO outbox_enqueue (type, data) VALUES (?, ?)", ("t" * 300, "{}"))
            except sqlite3.IntegrityError as e:
                report["refused"].append(str(e))
            try:
                conn.execute("INSERT INTO outbox_enqueue (type, data) VALUES ('order.note', '{oops')")
            except sqlite3.IntegrityError as e:
                report["refused"].append(str(e))
        if n % rollback_every == rollback_every - 1:
            conn.execute("ROLLBACK")
            report["rolled_back"].append(order)
        else:
            conn.execute("COMMIT")
            report["committed"].append(order)
    # The documented way to learn a new event's id: read it back by its idempotency key.
    first = report["committed"][0]
    row = conn.execute(
        "SELECT event_id FROM outbox_events WHERE idempotency_key = ? ORDER BY id LIMIT 1", (first,)
    ).fetchone()
    report["read_back"] = {first: row[0]}
    conn.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
