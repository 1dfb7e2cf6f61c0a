// An app in Node writing to an outbox file, as an Electron or Node desktop app would: each
// order and the event that announces it in one transaction of its own, through the SQL
// contract (`INSERT INTO outbox_enqueue`), with better-sqlite3 from npm.
//
// Usage: node writer.mjs DB ORDERS ROLLBACK_EVERY
// Prints one JSON object: the orders committed and rolled back, the errors of refused
// inserts, and the event id read back by an idempotency key.

import Database from 'better-sqlite3';

const [db, ordersArg, rollbackArg] = process.argv.slice(2);
const orders = Number(ordersArg);
const rollbackEvery = Number(rollbackArg);

const conn = new Database(db, { timeout: 10000 });
conn.exec('CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, lang TEXT, n INTEGER)');
const insertOrder = conn.prepare("INSERT INTO orders (id, lang, n) VALUES (?, 'node', ?)");
const enqueue = conn.prepare(
  'INSERT INTO outbox_enqueue (type, data, key, idempotency_key) VALUES (?, ?, ?, ?)'
);

class RolledBack extends Error {}

const report = { sqlite: conn.prepare('SELECT sqlite_version() AS v').get().v,
                 committed: [], rolled_back: [], refused: [] };

// better-sqlite3 commits when the function returns and rolls back when it throws.
const place = conn.transaction((n) => {
  const order = `js-${n}`;
  insertOrder.run(order, n);
  enqueue.run('order.created', JSON.stringify({ order, n }), `js-key-${n % 5}`, order);
  if (n % 7 === 3) {
    // A bad event fails its own statement only: the transaction goes on.
    try {
      enqueue.run('order.created', '{}', 'k'.repeat(300), null);
    } catch (e) {
      report.refused.push(e.message);
    }
  }
  if (n % rollbackEvery === rollbackEvery - 1) {
    throw new RolledBack(order);
  }
  return order;
});

for (let n = 0; n < orders; n++) {
  try {
    report.committed.push(place.immediate(n));
  } catch (e) {
    if (!(e instanceof RolledBack)) throw e;
    report.rolled_back.push(e.message);
  }
}

const first = report.committed[0];
const row = conn
  .prepare('SELECT event_id FROM outbox_events WHERE idempotency_key = ? ORDER BY id LIMIT 1')
  .get(first);
report.read_back = { [first]: row.event_id };
conn.close();
console.log(JSON.stringify(report));
