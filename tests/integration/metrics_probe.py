"""Bad requests against the scheduler's metrics port (test_metrics.sh).

usage: metrics_probe.py PORT

Prints one line per probe, "ok NAME" or "FAIL NAME: why", and exits 1
when any failed.  Each probe is a real client on a real socket: another
method, an unknown path, a malformed request line, a head over 8 KiB, a
request that never completes (slowloris), more connections than the
server keeps; after them all, a GET of /metrics is still answered.
"""
import socket
import sys
import time

PORT = int(sys.argv[1])
FAILED = []


def connect():
    return socket.create_connection(("127.0.0.1", PORT), timeout=15)


def status_of(sock):
    """The status code of the response on sock (0: closed with none)."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def request(raw):
    sock = connect()
    sock.sendall(raw)
    return status_of(sock)


def expect(name, got, want):
    if got == want:
        print(f"ok   {name} ({got})")
    else:
        print(f"FAIL {name}: status {got}, expected {want}")
        FAILED.append(name)


expect("POST is refused", request(b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"), 405)
expect("PUT is refused", request(b"PUT / HTTP/1.1\r\n\r\n"), 405)
expect("HEAD is refused", request(b"HEAD /metrics HTTP/1.1\r\n\r\n"), 405)
expect("an unknown path", request(b"GET /etc/passwd HTTP/1.1\r\n\r\n"), 404)
expect("a path outside the root", request(b"GET ../metrics HTTP/1.1\r\n\r\n"), 400)
expect("a malformed request line", request(b"HELLO\r\n\r\n"), 400)
expect("a head over 8 KiB", request(b"GET /metrics HTTP/1.1\r\nX-Long: " + b"a" * 10000 + b"\r\n\r\n"),
       431)

# Slowloris: half a request, then nothing; closed with 408 within the deadline.
t0 = time.time()
slow = connect()
slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
got = status_of(slow)
took = time.time() - t0
expect(f"a request that never ends is cut off ({took:.1f} s)", got if took < 10 else -1, 408)

# More connections than the server keeps: the ones over its limit are
# answered 503 at once, the rest stay open until the deadline.
held = [connect() for _ in range(40)]
time.sleep(0.5)
busy = 0
for sock in held[32:]:
    sock.settimeout(2)
    busy += status_of(sock) == 503
expect("connections over the limit are refused", busy, 8)
for sock in held[:32]:
    sock.close()
time.sleep(0.5)
expect("metrics are still served", request(b"GET /metrics HTTP/1.1\r\n\r\n"), 200)
sys.exit(1 if FAILED else 0)
