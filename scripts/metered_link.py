# scripts/metered_link.py BIN: what `outbox relay` puts on the wire, measured at a real
# receiver on 127.0.0.1 (python's http.server):
#   1. bytes per event for batches of 100 telemetry events, --compress gzip against none,
#      and the drain's events/s with each (2,000 events, already committed);
#   2. requests per 1,000 events arriving at 10 a second (another process, the SQL
#      contract), --batch 100 --linger 2s against --batch 100 alone, and the commit ->
#      receipt delay of each;
#   3. the relay's CPU time (user + system) per delivered event in each of those runs.
import gzip, http.server, json, os, resource, sqlite3, subprocess, sys, tempfile, threading, time

BIN = sys.argv[1]


def telemetry(i):
    return {"device": "pump-%04d" % (i % 50), "seq": i, "ts": 1764800000000 + i * 100,
            "celsius": 20 + (i % 37) / 10, "humidity": 40 + (i % 23), "battery": 0.87,
            "rssi": -70 - (i % 9), "firmware": "2.4.1", "t": time.time()}


class Receiver:
    def __init__(self):
        self.requests, self.wire_bytes, self.events, self.delays = 0, 0, 0, []
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(s):
                body = s.rfile.read(int(s.headers.get("content-length", 0)))
                now = time.time()
                rec.requests += 1
                rec.wire_bytes += len(body)
                if s.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                doc = json.loads(body)
                for e in doc if isinstance(doc, list) else [doc]:
                    rec.events += 1
                    rec.delays.append(now - e["data"]["t"])
                s.send_response(204)
                s.end_headers()

            def log_message(*a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d/events" % self.server.server_address[1]


def fresh_db():
    db = os.path.join(tempfile.mkdtemp(), "o.db")
    subprocess.run([BIN, "--db", db, "init"], check=True, capture_output=True)
    return db


def drain(compress):
    db = fresh_db()
    c = sqlite3.connect(db)
    for i in range(2000):
        c.execute("INSERT INTO outbox_enqueue (type, data) VALUES ('reading.taken', ?)",
                  (json.dumps(telemetry(i)),))
    c.commit()
    r = Receiver()
    args = [BIN, "--db", db, "relay", "--url", r.url, "--batch", "100", "--until-empty"]
    if compress:
        args += ["--compress", "gzip"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run(args, check=True, capture_output=True)
    took = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    r.server.shutdown()
    return r.wire_bytes / r.events, r.events / took, cpu / r.events


def trickle(linger, seconds=30):
    db = fresh_db()
    r = Receiver()
    args = [BIN, "--db", db, "relay", "--url", r.url, "--batch", "100"]
    if linger:
        args += ["--linger", "2s"]
    relay = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    time.sleep(2)
    c = sqlite3.connect(db, timeout=10)
    n = seconds * 10
    start = time.monotonic()
    for i in range(n):
        time.sleep(max(0, start + i / 10 - time.monotonic()))
        c.execute("INSERT INTO outbox_enqueue (type, data) VALUES ('reading.taken', ?)",
                  (json.dumps(telemetry(i)),))
        c.commit()
    time.sleep(3)
    with open("/proc/%d/stat" % relay.pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    relay.terminate()
    relay.wait()
    r.server.shutdown()
    d = sorted(r.delays)
    return r.requests * 1000 / r.events, d[len(d) // 2] * 1000, d[-1] * 1000, r.events, n, cpu / r.events


for compress in (False, True):
    per_event, rate, cpu = drain(compress)
    print("batch 100, compress %-4s: %.0f bytes/event on the wire, drain %.0f events/s, %.0f µs CPU/event"
          % ("gzip" if compress else "none", per_event, rate, cpu * 1e6))
for linger in (False, True):
    per_1000, p50, worst, got, sent, cpu = trickle(linger)
    print("10 events/s, batch 100%s: %.0f requests per 1,000 events, delay p50 %.0f ms, max %.0f ms (%d/%d), %.0f µs CPU/event"
          % (", linger 2s" if linger else "", per_1000, p50, worst, got, sent, cpu * 1e6))
