# scripts/cross_process_latency.py BIN SECONDS: commit -> receipt latency of events written by another process
# (python sqlite3, the SQL contract) at 20 commits a second, delivered by `BIN relay`.
import http.server, json, os, sqlite3, subprocess, sys, tempfile, threading, time
bin_, secs = sys.argv[1], float(sys.argv[2])
d = tempfile.mkdtemp(); db = os.path.join(d, "o.db")
subprocess.run([bin_, "--db", db, "init"], check=True, capture_output=True)
lat = []
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(s):
        body = s.rfile.read(int(s.headers.get("content-length", 0)))
        now = time.time()
        ev = json.loads(body)
        for e in (ev if isinstance(ev, list) else [ev]):
            lat.append(now - e["data"]["t"])
        s.send_response(204); s.end_headers()
    def log_message(*a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
relay = subprocess.Popen([bin_, "--db", db, "relay", "--url", f"http://127.0.0.1:{srv.server_address[1]}/"], stderr=subprocess.DEVNULL)
time.sleep(2)
c = sqlite3.connect(db, timeout=10)
n = int(secs * 20); start = time.monotonic()
for i in range(n):
    target = start + i / 20
    time.sleep(max(0, target - time.monotonic()))
    c.execute("INSERT INTO outbox_enqueue (type, data) VALUES ('x', ?)", (json.dumps({"t": time.time()}),))
    c.commit()
time.sleep(1)
relay.terminate(); relay.wait()
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
print(f"events {len(lat)}/{n}  p50 {q(0.5):.1f} ms  p90 {q(0.9):.1f} ms  p99 {q(0.99):.1f} ms  max {lat[-1]*1000:.1f} ms")
