#!/bin/bash
# scripts/idle_wakeups.sh SECONDS [BIN]: an idle `outbox relay` (receiver up, nothing pending): wake-ups/s and CPU over SECONDS
D=$(mktemp -d); BIN=${2:-target/release/outbox}
$BIN --db $D/o.db init >/dev/null 2>&1
PORT=$((20000 + RANDOM % 10000))
python3 -c '
import http.server,sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(s):
        n=int(s.headers.get("content-length",0)); s.rfile.read(n); s.send_response(204); s.end_headers()
    def log_message(*a): pass
http.server.HTTPServer(("127.0.0.1",int(sys.argv[1])),H).serve_forever()' $PORT &
SRV=$!
$BIN --db $D/o.db relay --url http://127.0.0.1:$PORT/ 2>/dev/null &
P=$!
sleep 3
sum() { cat /proc/$P/task/*/status | awk '/^voluntary_ctxt/{s+=$2} END{print s}'; }
cpu() { awk '{print $14+$15}' /proc/$P/stat; }
a=$(sum); c=$(cpu); sleep $1; b=$(sum); d=$(cpu)
python3 -c "print('threads', $(ls /proc/$P/task | wc -l), 'wakeups/s %.2f' % (($b-$a)/$1), 'cpu s/min %.3f' % (($d-$c)/100*60/$1))"
kill $P $SRV; wait 2>/dev/null; rm -rf $D
