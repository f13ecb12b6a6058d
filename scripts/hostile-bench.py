#!/usr/bin/env python3
"""Hostile-client benchmark: what unauthenticated peers can make a release broker spend.

Starts `starling` on loopback with a password file and anonymous clients refused, then:

  (a) memory: RSS before and after 1,500 sockets that each send a CONNECT fixed header
      declaring ~1 MiB plus as much body as the broker will take (up to 900 KB), then
      stall; and the same with CONNECTs declaring just under max_connect_packet_size
      (the most the broker buffers), which is what the read budget is for.
  (b) a storm of wrong-password logins (100/s for 10 s), once from one address (the ban
      applies) and once spread over 200 addresses (only the verification pool protects),
      while 10 connected clients measure PINGREQ -> PINGRESP round trips and a correct
      login (from another address) is timed every 100 ms.

Figures are printed as a table and as one JSON line. Usage:

    scripts/hostile-bench.py                      # builds target/release/starling
    scripts/hostile-bench.py --binary PATH --no-build --label old

Loopback only; needs Linux (/proc, 127.0.0.0/8 source addresses).
"""

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER, RIGHT, WRONG = b"alice", b"right-password", b"wrong-password"


# --- MQTT bytes -------------------------------------------------------------------------

def var_int(n):
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(b):
    return len(b).to_bytes(2, "big") + b


def connect(client_id, username=None, password=None, keepalive=60):
    """An MQTT 3.1.1 CONNECT (clean session)."""
    flags = 0x02 | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = field(b"MQTT") + bytes([4, flags]) + keepalive.to_bytes(2, "big") + field(client_id)
    if username is not None:
        body += field(username)
    if password is not None:
        body += field(password)
    return b"\x10" + var_int(len(body)) + body


def oversized_head(remaining):
    """The start of an MQTT 5 CONNECT declaring `remaining` bytes after the fixed header."""
    return b"\x10" + var_int(remaining) + field(b"MQTT") + bytes([5, 0xC2, 0, 60])


PINGREQ = b"\xc0\x00"


def read_connack(s, timeout):
    """The CONNACK return code, or None if closed / nothing in time."""
    s.settimeout(timeout)
    buf = b""
    try:
        while len(buf) < 4:
            chunk = s.recv(4 - len(buf))
            if not chunk:
                return None
            buf += chunk
    except (socket.timeout, OSError):
        return None
    return buf[3] if buf[0] == 0x20 else None


def open_from(source, addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if source:
        s.bind((source, 0))
    s.connect(addr)
    return s


# --- the broker --------------------------------------------------------------------------

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, binary, workdir, extra_auth=""):
        self.port = free_port()
        self.ws_port = free_port()
        passwd = os.path.join(workdir, "passwd")
        if not os.path.exists(passwd):
            subprocess.run([binary, "passwd", passwd, USER.decode()], input=RIGHT + b"\n",
                           check=True, capture_output=True)
        conf = os.path.join(workdir, "starling.toml")
        with open(conf, "w") as f:
            f.write(f"""[[listeners]]
kind = "tcp"
bind = "127.0.0.1:{self.port}"
allow_anonymous = false
[[listeners]]
kind = "ws"
bind = "127.0.0.1:{self.ws_port}"
allow_anonymous = false
[auth]
password_file = "{passwd}"
{extra_auth}
[log]
level = "info"
""")
        self.log_path = os.path.join(workdir, f"broker-{self.port}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, "--config", conf], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.addr = ("127.0.0.1", self.port)
        self.ws_addr = ("127.0.0.1", self.ws_port)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(self.addr, timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("broker did not start; see " + self.log_path)

    def rss_kib(self):
        return rss_kib(self.proc.pid)

    def log_lines(self, needle):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return sum(1 for line in f if needle in line)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# --- (a) memory --------------------------------------------------------------------------

def ws_open(addr, payload_len):
    """A WebSocket upgrade, then the header of one binary frame of `payload_len` bytes
    (masked with a zero key, so the payload goes as it is): the broker's WebSocket layer
    buffers a whole message before it yields any of it."""
    s = open_from(None, addr)
    s.sendall(b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
              b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
    s.settimeout(5)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = s.recv(4096)
        if not chunk:
            raise SystemExit("WebSocket upgrade refused")
        answer += chunk
    s.sendall(bytes([0x82, 0x80 | 127]) + payload_len.to_bytes(8, "big") + b"\0\0\0\0")
    return s


def stalled_connects(broker, n, remaining, body_max, settle=3.0, ws=False):
    """RSS delta (KiB) with `n` sockets each sending the head of a CONNECT declaring
    `remaining` bytes, then up to `body_max` body bytes (as many as the broker takes);
    with `ws`, over WebSocket, in one binary message holding the whole CONNECT."""
    time.sleep(0.5)
    before = broker.rss_kib()
    socks, sent = [], []
    head = oversized_head(remaining)
    for _ in range(n):
        if ws:
            s = ws_open(broker.ws_addr, len(head) + remaining)
        else:
            s = open_from(None, broker.addr)
        s.sendall(head)
        s.setblocking(False)
        socks.append(s)
        sent.append(0)
    chunk = b"\0" * 65536
    deadline, idle_since = time.time() + 60, time.time()
    while time.time() < deadline and time.time() - idle_since < 2:
        progress = False
        for i, s in enumerate(socks):
            if s is None or sent[i] >= body_max:
                continue
            try:
                k = s.send(chunk[: min(len(chunk), body_max - sent[i])])
                sent[i] += k
                progress = progress or k > 0
            except BlockingIOError:
                pass
            except OSError:
                socks[i] = None  # refused and closed by the broker
        if progress:
            idle_since = time.time()
        else:
            time.sleep(0.05)
    time.sleep(settle)
    after = broker.rss_kib()
    closed = sum(1 for s in socks if s is None)
    for s in socks:
        if s is not None:
            s.close()
    time.sleep(1)
    return {
        "rss_before_mib": round(before / 1024, 1),
        "rss_after_mib": round(after / 1024, 1),
        "rss_delta_mib": round((after - before) / 1024, 1),
        "body_sent_mib": round(sum(sent) / 2**20, 1),
        "closed_by_broker": closed,
    }


# --- (b) login storm ---------------------------------------------------------------------

def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def ms(x):
    return None if x is None else round(x * 1000, 1)


def storm(broker, rate, seconds, sources, clients=10):
    stop = threading.Event()
    rtts, logins, login_codes, storm_codes = [], [], {}, {}
    lock = threading.Lock()

    def pinger(i):
        s = open_from("127.0.0.1", broker.addr)
        s.sendall(connect(f"pinger-{i}".encode(), USER, RIGHT))
        assert read_connack(s, 10) == 0, "pinger login failed"
        s.settimeout(5)
        while not stop.is_set():
            t0 = time.perf_counter()
            s.sendall(PINGREQ)
            if s.recv(2) != b"\xd0\x00":
                raise SystemExit("no PINGRESP")
            with lock:
                rtts.append(time.perf_counter() - t0)
            time.sleep(0.02)
        s.close()

    def good_login():
        k = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            s = open_from("127.0.0.1", broker.addr)
            s.sendall(connect(f"good-{k}".encode(), USER, RIGHT))
            code = read_connack(s, 10)
            dt = time.perf_counter() - t0
            s.close()
            with lock:
                login_codes[code] = login_codes.get(code, 0) + 1
                if code == 0:
                    logins.append(dt)
            k += 1
            time.sleep(0.1)

    def attacker():
        open_socks = []
        k, t_start = 0, time.perf_counter()
        while not stop.is_set():
            due = t_start + k / rate
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            try:
                s = open_from(sources[k % len(sources)], broker.addr)
                s.sendall(connect(f"storm-{k}".encode(), USER, WRONG))
                open_socks.append((time.perf_counter(), s))
            except OSError:
                pass
            k += 1
            # Collect answers of attempts older than 2 s.
            while open_socks and time.perf_counter() - open_socks[0][0] > 2:
                _, old = open_socks.pop(0)
                code = read_connack(old, 0.01)
                storm_codes[code] = storm_codes.get(code, 0) + 1
                old.close()
        for _, s in open_socks:
            code = read_connack(s, 2)
            storm_codes[code] = storm_codes.get(code, 0) + 1
            s.close()

    pingers = [threading.Thread(target=pinger, args=(i,)) for i in range(clients)]
    for t in pingers:
        t.start()
    time.sleep(1)
    with lock:
        rtts.clear()
    threads = [threading.Thread(target=good_login), threading.Thread(target=attacker)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads + pingers:
        t.join(30)
    return {
        "rtt_median_ms": ms(statistics.median(rtts)) if rtts else None,
        "rtt_p99_ms": ms(pct(rtts, 99)),
        "rtt_max_ms": ms(max(rtts)) if rtts else None,
        "login_median_ms": ms(statistics.median(logins)) if logins else None,
        "login_p99_ms": ms(pct(logins, 99)),
        "good_login_codes": {str(k): v for k, v in sorted(login_codes.items(), key=str)},
        "storm_codes": {str(k): v for k, v in sorted(storm_codes.items(), key=str)},
    }


# --- main --------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "starling"))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--label", default="new")
    ap.add_argument("--sockets", type=int, default=1500)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-storm", action="store_true")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * args.sockets + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < 2 * args.sockets + 256:
        raise SystemExit(f"ulimit -n is {want}; need about {2 * args.sockets + 256}")

    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "starling"], cwd=ROOT, check=True)
    work = tempfile.mkdtemp(prefix="starling-hostile-")
    result = {"label": args.label}
    try:
        if not args.skip_memory:
            b = Broker(args.binary, work)
            try:
                result["claim_1mib"] = stalled_connects(b, args.sockets, 1_048_000, 900_000)
                result["claim_16kib"] = stalled_connects(b, args.sockets, 16_000, 15_000)
                result["ws_claim_1mib"] = stalled_connects(
                    b, args.sockets, 1_048_000, 900_000, ws=True)
            finally:
                b.stop()
        if not args.skip_storm:
            for name, sources in [
                ("storm_one_address", ["127.0.0.2"]),
                ("storm_200_addresses", [f"127.0.{2 + i // 250}.{1 + i % 250}" for i in range(200)]),
            ]:
                b = Broker(args.binary, work)
                try:
                    r = storm(b, args.rate, args.seconds, sources)
                    r["log_lines_login_refused"] = b.log_lines("login refused")
                    r["rss_after_mib"] = round(b.rss_kib() / 1024, 1)
                    result[name] = r
                finally:
                    b.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n== {args.label} ==")
    for k, v in result.items():
        if isinstance(v, dict):
            print(f"{k}:")
            for kk, vv in v.items():
                print(f"  {kk:26} {vv}")
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
