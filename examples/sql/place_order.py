"""Place an order and enqueue its event in one transaction, from Python, through the SQL
contract of sqlite-outbox. `outbox relay` (running beside the app) delivers the event.

    outbox --db shop.db init
    python3 examples/sql/place_order.py shop.db 42 990
"""

import json
import sqlite3
import sys

db, order_id, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

# isolation_level=None: this code begins its transactions itself, as BEGIN IMMEDIATE, so it
# waits for the write lock (up to `timeout`) instead of failing half-way.
conn = sqlite3.connect(db, timeout=5, isolation_level=None)
conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)")

conn.execute("BEGIN IMMEDIATE")
try:
    conn.execute("INSERT INTO orders (id, total) VALUES (?, ?)", (order_id, total))
    conn.execute(
        "INSERT INTO outbox_enqueue (type, data, key, idempotency_key) VALUES (?, ?, ?, ?)",
        ("order.created", json.dumps({"id": order_id, "total": total}),
         "customer-7", f"order-{order_id}-created"),
    )
    conn.execute("COMMIT")
except sqlite3.Error:
    conn.execute("ROLLBACK")
    raise

# The event's id, read back by its idempotency key.
(event_id,) = conn.execute(
    "SELECT event_id FROM outbox_events WHERE idempotency_key = ? ORDER BY id LIMIT 1",
    (f"order-{order_id}-created",),
).fetchone()
print(f"order {order_id} committed with event {event_id}")

# A bad event fails its own statement with a clear error; the transaction stays usable.
conn.execute("BEGIN IMMEDIATE")
try:
    conn.execute("INSERT INTO outbox_enqueue (type, data) VALUES ('order.note', '{not json')")
except sqlite3.IntegrityError as e:
    print(f"refused: {e}")
conn.execute("ROLLBACK")
