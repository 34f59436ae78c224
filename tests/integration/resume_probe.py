"""resume_probe.py PORT PORT2 - the refusals of a restarted scheduler, on the
wire (test_chaos_modes.sh; issue 52).  PORT's scheduler (1 worker, 1
server) is resumed by a server of generation 2; a worker of generation 1
is refused as stale, and a node registering afresh is refused.  PORT2's
scheduler (the same job) gets a fresh server first, then a resume: refused.
Prints each answer; exits 1 on the first unexpected one.  No job secret is
set, so there is no handshake."""
import socket
import struct
import sys

HDR = struct.Struct("<IBBHIIQQQB3xI")
MAGIC, REGISTER, ADDRBOOK, ERROR = 0x4D555355, 1, 2, 11
ROLE_SERVER, ROLE_WORKER = 2, 3
with open(__file__.rsplit("/", 3)[0] + "/src/wire/wire.h") as f:
    VERSION = int(next(line.split()[2] for line in f if line.startswith("#define WIRE_VERSION")))


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def wstr(s):
    return u32(len(s)) + s.encode()


def register(role, rank, resume):
    """REGISTER; resume: None (fresh) or (id, rank, generation)."""
    body = (u32(role) + u32(rank) + u32(40000) + u32(0) + u32(1) + wstr("127.0.0.1") +
            u32(4242) + wstr("probe-host") + u32(-1) + wstr("tcp"))
    if resume is None:
        return body + u32(0)
    node_id, rrank, gen = resume
    # id, rank, gen, local size, workers, servers, joined, failovers, no
    # HELD to follow, 4 x (entered, done), no lost server
    return body + u32(1) + b"".join(map(u32, [node_id, rrank, gen, 1, 1, 1, 0, 0, 0] + [0] * 8 +
                                             [0]))


def ask(port, payload):
    """Sends REGISTER, returns (type, round, text of an ERROR) of the answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(HDR.pack(MAGIC, VERSION, REGISTER, 0, 0, 0, 0, 0, len(payload), 0, 0) + payload)
    head = b""
    while len(head) < HDR.size:
        chunk = s.recv(HDR.size - len(head))
        if not chunk:
            return s, None, 0, "closed"
        head += chunk
    _, _, mtype, _, _, rnd, _, _, plen, _, _ = HDR.unpack(head)
    body = b""
    while len(body) < plen:
        body += s.recv(plen - len(body))
    text = body[4:].decode(errors="replace") if mtype == ERROR else ""
    return s, mtype, rnd, text


def expect(what, ok, got):
    print(("ok   " if ok else "FAIL ") + what + ": " + got)
    if not ok:
        sys.exit(1)


def main():
    port, port2 = int(sys.argv[1]), int(sys.argv[2])
    keep = []
    s, mtype, rnd, text = ask(port, register(ROLE_SERVER, 0, (1, 0, 2)))
    keep.append(s)
    expect("a server of generation 2 resumes the job", mtype == ADDRBOOK and rnd == 2,
           "type %s, generation %s" % (mtype, rnd))
    s, mtype, _, text = ask(port, register(ROLE_WORKER, 0, (2, 0, 1)))
    expect("a worker of generation 1 is refused as stale",
           mtype == ERROR and "stale" in text and "generation 1" in text and "generation 2" in text,
           text)
    s, mtype, _, text = ask(port, register(ROLE_WORKER, 0, None))
    expect("a fresh worker is refused by a resumed scheduler",
           mtype == ERROR and "resumes a running job" in text, text)
    s2 = socket.create_connection(("127.0.0.1", port2), timeout=10)
    payload = register(ROLE_SERVER, 0, None)
    s2.sendall(HDR.pack(MAGIC, VERSION, REGISTER, 0, 0, 0, 0, 0, len(payload), 0, 0) + payload)
    keep.append(s2)
    s, mtype, _, text = ask(port2, register(ROLE_WORKER, 0, (2, 0, 0)))
    expect("a resume to a scheduler that started afresh is refused",
           mtype == ERROR and "started a job afresh" in text, text)


main()
