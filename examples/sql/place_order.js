// Place an order and enqueue its event in one transaction, from Node (better-sqlite3),
// through the SQL contract of sqlite-outbox. `outbox relay` (running beside the app)
// delivers the event.
//
//     outbox --db shop.db init
//     npm install better-sqlite3
//     node examples/sql/place_order.js shop.db 42 990

const Database = require('better-sqlite3');

const [db, orderId, total] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
const conn = new Database(db, { timeout: 5000 });
conn.exec('CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)');

const placeOrder = conn.transaction((id, sum) => {
  conn.prepare('INSERT INTO orders (id, total) VALUES (?, ?)').run(id, sum);
  conn
    .prepare('INSERT INTO outbox_enqueue (type, data, key, idempotency_key) VALUES (?, ?, ?, ?)')
    .run('order.created', JSON.stringify({ id, total: sum }), 'customer-7', `order-${id}-created`);
});
// .immediate: BEGIN IMMEDIATE, so the transaction waits for the write lock up front.
placeOrder.immediate(orderId, total);

// The event's id, read back by its idempotency key.
const { event_id: eventId } = conn
  .prepare('SELECT event_id FROM outbox_events WHERE idempotency_key = ? ORDER BY id LIMIT 1')
  .get(`order-${orderId}-created`);
console.log(`order ${orderId} committed with event ${eventId}`);

// A bad event fails its own statement with a clear error.
try {
  conn.prepare("INSERT INTO outbox_enqueue (type, data) VALUES ('order.note', '{not json')").run();
} catch (e) {
  console.log(`refused: ${e.message}`);
}
