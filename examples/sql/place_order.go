// Place an order and enqueue its event in one transaction, from Go (database/sql), through
// the SQL contract of sqlite-outbox. `outbox relay` (running beside the app) delivers the
// event.
//
//	outbox --db shop.db init
//	go run place_order.go shop.db 42 990
//
// Any database/sql SQLite driver works: modernc.org/sqlite (pure Go, below) or
// github.com/mattn/go-sqlite3 (cgo; driver name "sqlite3").
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"

	_ "modernc.org/sqlite"
)

func main() {
	db, err := sql.Open("sqlite", os.Args[1]+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	id, _ := strconv.Atoi(os.Args[2])
	total, _ := strconv.Atoi(os.Args[3])
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER)"); err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock=immediate)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total) VALUES (?, ?)", id, total); err != nil {
		log.Fatal(err)
	}
	data, _ := json.Marshal(map[string]int{"id": id, "total": total})
	key := fmt.Sprintf("order-%d-created", id)
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO outbox_enqueue (type, data, key, idempotency_key) VALUES (?, ?, ?, ?)",
		"order.created", string(data), "customer-7", key); err != nil {
		log.Fatal(err) // "outbox: …" names the field and its limit
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The event's id, read back by its idempotency key.
	var eventID string
	if err := db.QueryRowContext(ctx,
		"SELECT event_id FROM outbox_events WHERE idempotency_key = ? ORDER BY id LIMIT 1",
		key).Scan(&eventID); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("order %d committed with event %s\n", id, eventID)
}
