#!/usr/bin/python3
"""make_corpus.py - writes the seed corpora of fuzz_wire and fuzz_auth
(tests/fuzz/corpus/wire and tests/fuzz/corpus/auth).

Each seed is a 48-byte header laid out as src/wire/wire.h describes, then
an optional control payload laid out as src/rendezvous/rdv_proto.h
describes.  Valid seeds cover every message type; malformed ones break one
rule each, so the fuzzer starts next to every rejection path.

The auth seeds follow the input layout at the top of fuzz_auth.c: each
side, honest and raw peers, the same and another secret, a replay, a
hang-up in each message and a flipped bit in each field.

    make_corpus.py [--check] [OUT_DIR]

Writes OUT_DIR/wire and OUT_DIR/auth (OUT_DIR defaults to corpus beside
this script), replacing the seeds it owns and leaving other files alone.  With --check it writes
nothing and exits 1 when OUT_DIR differs from what it would write.
"""
import os
import re
import struct
import sys

MAGIC = 0x4D555355  # "USUM" little-endian
# The seeds carry the version the decoder accepts (else the fuzzer starts
# at the version check only): read it from wire.h.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "wire",
                       "wire.h")) as _f:
    VERSION = int(re.search(r"#define WIRE_VERSION (\d+)", _f.read()).group(1))
HDR = struct.Struct("<IBBHIIQQQB3xI")  # the 48-byte header, wire.h offsets
assert HDR.size == 48

(REGISTER, ADDRBOOK, BARRIER, BARRIER_DONE, HEARTBEAT, PUSH, PUSH_ACK, PULL,
 PULL_REPLY, DECLARE_CHECK, ERROR, SHUTDOWN, DECLARE, TUNE, RETIRE) = range(1, 16)
ANNOUNCE = 17
FAILOVER, RESTORE, REJOIN, MIGRATE, MOVED = 19, 20, 21, 22, 23
REFORM, RESIZE, HELD, COPY, COPY_ACK = 24, 25, 26, 27, 28
FLAG_ZERO, FLAG_IPC = 0x1, 0x2
F_COMPRESSED = 0x8  # WIRE_FLAG_COMPRESSED (wire 11; RESTORE and COPY since 19)
F_PUSHED = 0x20  # WIRE_FLAG_PUSHED: a RESTORE that carries a push (wire 20)
FLAG_PULL = 0x10  # a PUSH that carries its PULL (wire 15)
OP_SUM, OP_AVERAGE, OP_BROADCAST = range(3)  # a PUSH's aux: kind | root << 8
OP_ALLGATHER = 6  # WIRE_OP_ALLGATHER: rows OR-ed (a ZERO push is one's nothing)
IPC_PAYLOAD = 24  # WIRE_IPC_PAYLOAD: the addresses of the data and of the guard, the guard
IPC_REF = struct.pack("<QQQ", 0x7F3A5C001000, 0x7F3A5C000040, 7)  # such a payload
FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64 = range(6)
DTYPE_SIZE = {FLOAT32: 4, FLOAT64: 8, FLOAT16: 2, BFLOAT16: 2, INT32: 4, INT64: 8}
ROLE_SERVER, ROLE_WORKER = 2, 3


def header(mtype, flags=0, sender=0, rnd=0, key=0, count=0, payload_len=0, dtype=0,
           aux=0, magic=MAGIC, version=VERSION):
    """The 48 header bytes, exactly as wire_encode() writes them."""
    return HDR.pack(magic, version, mtype, flags, sender, rnd, key, count, payload_len,
                    dtype, aux)


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v):
    return struct.pack("<Q", v)


def wstr(s):
    """A wire_buf_str: u32 length, then the bytes (no NUL)."""
    b = s.encode() if isinstance(s, str) else s
    return u32(len(b)) + b


def message(mtype, payload=b"", **fields):
    """A header whose payload_len matches `payload`, then the payload."""
    fields.setdefault("payload_len", len(payload))
    return header(mtype, **fields) + payload


def data_message(mtype, dtype, count, flags=0, address=0x7F3A5C001000, **fields):
    """A PUSH or PULL_REPLY carrying count elements (none with ZERO; with
    IPC the address of the elements in the sender, its guard's address and
    value)."""
    if flags & FLAG_ZERO:
        payload = b""
    elif flags & FLAG_IPC:
        payload = u64(address) + IPC_REF[8:]
    else:
        payload = bytes((i * 37 + 11) & 0xFF for i in range(count * DTYPE_SIZE[dtype]))
    return (header(mtype, flags=flags, dtype=dtype, count=count, payload_len=len(payload),
                   **fields) + payload)


# rdv_host_identity(): boot id (36), net and pid namespace inodes in hex.
HOST_ID_A = "6f1c2e9a-43b7-4d0e-9a51-0c8e2b7f44d1/f0000098/effffffc"
HOST_ID_B = "d83a1f02-7c55-4e6b-8f19-b2e4c9a0375e/f0000000/effffffc"
HOST_ID_MAX = HOST_ID_B + "/" + "n" * (63 - len(HOST_ID_B) - 1)  # 63 chars, the most
assert len(HOST_ID_MAX) == 63


def register(role, req, port, local_rank, local_size, host, pid, host_id, rack=-1, resume=None,
             transport="tcp"):
    """A REGISTER payload (client.c rdv_register; resume: client_resume.c's part, u32s)."""
    body = (u32(role) + u32(req) + u32(port) + u32(local_rank) + u32(local_size) + wstr(host) +
            u32(pid) + wstr(host_id) + u32(rack) + wstr(transport))
    return body + u32(0) if resume is None else body + u32(1) + b"".join(map(u32, resume))


def addrbook(me, local_size, nodes):
    body = u32(me) + u32(local_size) + u32(len(nodes))
    for node_id, role, rank, port, host, pid, host_id in nodes:
        machine = rank // local_size if role == ROLE_WORKER else -1
        local_rank = rank % local_size if role == ROLE_WORKER else 0
        body += (u32(node_id) + u32(role) + u32(rank) + u32(machine) + u32(local_rank) +
                 u32(port) + wstr(host) + u32(pid) + wstr(host_id) + u32(node_id % 2))
    return body


def seeds():
    """name -> bytes of every seed this script owns."""
    # role, requested rank (-1), port, local rank, local size, host, pid, host id
    reg = register(ROLE_WORKER, -1, 40123, 0, 1, "10.0.0.7", 31337, HOST_ID_A)
    reg_local = register(ROLE_WORKER, 1, 0, 3, 4, "10.0.0.8", 4242, HOST_ID_MAX, rack=1)
    reg_head = reg[:20]  # the five u32 before the host
    # pid, host id, rack, transport and resume (0: a fresh node) after it
    reg_tail = u32(31337) + wstr(HOST_ID_A) + u32(-1) + wstr("tcp") + u32(0)
    # id, rank, generation, local size, workers, servers, joined, failovers,
    # HELDs that follow, 4 x (entered, done), n lost, the lost
    reg_resume = register(ROLE_WORKER, 1, 0, 1, 2, "10.0.0.8", 4242, HOST_ID_B, resume=[
        5, 3, 1, 2, 4, 2, 0, 1, 1, 0, 0, 2, 2, 0, 0, 3, 2, 1, 1])
    # HELD: the DECLARE request (str name, u64 partition bytes, no segments,
    # no shape, rack -1, no compression) and the reply's cut on servers 0, 1
    held_req = wstr("grad.w") + struct.pack("<Q", 4096) + u32(0) + u32(0) + u32(-1) + wstr("")
    held = (u32(len(held_req)) + held_req + u32(0) + u32(2) + struct.pack("<Q", 1024) + u32(0) +
            struct.pack("<Q", 976) + u32(1))
    book = addrbook(3, 1, [(1, ROLE_SERVER, 0, 40000, "10.0.0.5", 1201, HOST_ID_A),
                           (2, ROLE_SERVER, 1, 40001, "node-b.example", 977, HOST_ID_B),
                           (3, ROLE_WORKER, 0, 40002, "127.0.0.1", 1202, HOST_ID_A)])
    book_local = addrbook(4, 2, [(1, ROLE_SERVER, 0, 40000, "10.0.0.5", 300, HOST_ID_A),
                                 (2, ROLE_WORKER, 0, 0, "10.0.0.7", 301, HOST_ID_A),
                                 (3, ROLE_WORKER, 1, 0, "10.0.0.7", 302, HOST_ID_A),
                                 (4, ROLE_WORKER, 2, 0, "10.0.0.8", 88, HOST_ID_MAX),
                                 (5, ROLE_WORKER, 3, 0, "10.0.0.8", 89, HOST_ID_MAX)])
    return {
        # one valid message of every type
        "01-register": message(REGISTER, reg),
        "01-register-local-rank": message(REGISTER, reg_local),
        "01-register-resume": message(REGISTER, reg_resume),
        "26-held": message(HELD, held, sender=5, key=0x7A1B2C3D0000, count=2000,
                           dtype=FLOAT32),
        # a key's state to its backup: 3 int32 elements, 2 contributors' pushes;
        # and forgetting a key
        "27-copy": message(COPY, struct.pack("<3i", 5, -1, 7) + u32(4) + u32(3), sender=2,
                           key=0x7A1B2C3D0001, rnd=9, count=3, dtype=INT32, aux=2),
        "27-copy-forget": header(COPY, sender=2, key=0x7A1B2C3D0001, dtype=INT32),
        "28-copy-ack": header(COPY_ACK, sender=3, key=0x7A1B2C3D0001, rnd=9),
        # a compressed key's error feedback (2 floats) and its round's
        # encoding (onebit: scale and one word), and a compressed RESTORE
        "27-copy-compressed": message(COPY, struct.pack("<2f", 0.5, -0.25) +
                                      struct.pack("<fI", 1.0, 2), flags=F_COMPRESSED,
                                      sender=2, key=0x7A1B2C3D0002, rnd=4, count=2,
                                      dtype=FLOAT32),
        # a homed cut's push answered (wire 20): raw, its collective in aux;
        # and a ZERO one of an allgather
        "20-restore-pushed": data_message(RESTORE, INT32, 5, flags=F_PUSHED, key=0x70003, rnd=7,
                                          aux=OP_SUM),
        "20-restore-pushed-zero": header(RESTORE, flags=F_PUSHED | FLAG_ZERO, key=0x70003, rnd=7,
                                         count=5, dtype=INT32, aux=OP_ALLGATHER),
        "20-restore-compressed": message(RESTORE, struct.pack("<fI", 1.0, 2),
                                         flags=F_COMPRESSED, sender=2, key=0x7A1B2C3D0002,
                                         rnd=3, count=2, dtype=FLOAT32),
        "bad-copy-short": message(COPY, struct.pack("<3i", 5, -1, 7) + u32(4), sender=2,
                                  key=0x7A1B2C3D0001, rnd=9, count=3, dtype=INT32, aux=2),
        "02-addrbook": message(ADDRBOOK, book),
        "02-addrbook-machines": message(ADDRBOOK, book_local),
        "03-barrier": header(BARRIER, sender=3, aux=2),
        "04-barrier-done": header(BARRIER_DONE, aux=2),
        "05-heartbeat": header(HEARTBEAT, sender=5),
        # a node's counters (rendezvous/metrics.h): 19 values, 15 latency
        # buckets, 2 servers' pushed and pulled bytes, the longest wait
        "05-heartbeat-counters": message(
            HEARTBEAT, u32(19) + b"".join(u64(i * 1000) for i in range(19)) + u32(15) +
            b"".join(u64(i) for i in range(15)) + u32(2) + u64(1 << 20) + u64(1 << 20) +
            u64(0) + u64(0) + wstr("server 0: tensor 'w' round 3 waits for worker(s) 1"),
            sender=5),
        "06-push-float32": data_message(PUSH, FLOAT32, 4, sender=3, rnd=1, key=0x10000),
        "06-push-zero": data_message(PUSH, INT64, 1000, flags=FLAG_ZERO, rnd=2, key=0x10001,
                                     aux=OP_BROADCAST | 3 << 8),
        "06-push-average": data_message(PUSH, FLOAT64, 2, rnd=4, key=0x10003, aux=OP_AVERAGE),
        "06-push-ipc": data_message(PUSH, FLOAT32, 1 << 20, flags=FLAG_IPC, sender=3, rnd=1,
                                    key=0x10002),
        "06-push-with-pull": data_message(PUSH, FLOAT32, 4, flags=FLAG_PULL, sender=3, rnd=1,
                                          key=0x10000),
        "06-push-ipc-with-pull": data_message(PUSH, FLOAT32, 1 << 20, flags=FLAG_IPC | FLAG_PULL,
                                              sender=3, rnd=1, key=0x10002),
        "07-push-ack": header(PUSH_ACK, key=0x10000, rnd=1),
        "08-pull": header(PULL, dtype=FLOAT16, key=0x10000, rnd=1),
        "09-pull-reply-bfloat16": data_message(PULL_REPLY, BFLOAT16, 3, key=0x10000, rnd=1),
        "09-pull-reply-ipc": data_message(PULL_REPLY, FLOAT64, 4096, flags=FLAG_IPC,
                                          address=0x55D0C4A2E040, key=0x10002, rnd=1),
        "10-declare-check": message(DECLARE_CHECK, wstr("layer1.weight"), dtype=INT32,
                                    count=1 << 20, key=0x20000),
        "11-error": message(ERROR, wstr("tensor 'w' declared as float32[10] by worker 0"),
                            aux=5),
        "12-shutdown": header(SHUTDOWN, sender=4),
        # name, partition bytes, no segments, shape [1024, 1024], rack 1
        "13-declare": message(DECLARE, wstr("layer1.weight") + u64(4 << 20) + u32(0) + u32(2) +
                              u64(1024) + u64(1024) + u32(1), dtype=FLOAT32, count=1 << 20),
        "13-declare-reply-ok": message(DECLARE, u32(0) + u32(2) + u64(700) + u32(0) + u64(324) + u32(1),
                                       key=0x30000),
        "13-declare-reply-mismatch": message(DECLARE, u32(-5) + wstr("shapes differ"),
                                             key=0x30000),
        "14-tune": message(TUNE, u64(1 << 20) + u64(4 << 20) + u32(0) + u32(1) + u32(10), rnd=3),
        "14-tune-final": message(TUNE, u64(2 << 20) + u64(8 << 20) + u32(1) + u32(2) + u32(1),
                                 rnd=9),
        "15-retire": header(RETIRE, key=0x70003, rnd=12),
        # a push_pull of float32[4, 8] to a joined worker; an allgather's
        # round (the tensor's key after the shape, wire 22)
        "17-announce": message(ANNOUNCE, wstr("layer1.weight") + u32(2) + u64(4) + u64(8) +
                               u64(0x70000), dtype=FLOAT32, count=32, rnd=3, key=1),
        "17-announce-allgather": message(ANNOUNCE, wstr("gather") + u32(0) + u64(0x80000),
                                         dtype=INT32, count=6, rnd=2, aux=6, key=2),
        # server 1 lost (failover 1): two pieces moved to servers 0 and 2
        "19-failover": message(FAILOVER, u32(2) + u64(0x70000) + u32(0) + u64(0x70001) + u32(2),
                               rnd=1, aux=1),
        "20-restore": data_message(RESTORE, INT32, 5, key=0x70001, rnd=41),
        "22-migrate": message(MIGRATE, u32(1) + u64(0x70001) + u32(1), rnd=1, aux=1),
        "23-moved": header(MOVED, key=0x70001, rnd=42, aux=1),
        # elastic: the job re-forms for generation 2 (the reason), a worker's
        # answer, and 1 worker waiting to join
        "24-reform": message(REFORM, wstr("worker 3 was lost"), aux=2),
        "24-reform-answer": header(REFORM, aux=2),
        "25-resize": header(RESIZE, aux=1),
        # server 1's replacement: a one-entry address book
        "21-rejoin": message(REJOIN, u32(0) + u32(1) + u32(1) + u32(2) + u32(ROLE_SERVER) + u32(1) +
                             u32(0xFFFFFFFF) + u32(0) + u32(4100) + wstr("10.0.0.9") + u32(77) +
                             wstr("host-9") + u32(0xFFFFFFFF), aux=1),
        # malformed, one rule broken each
        "bad-magic": message(REGISTER, reg, magic=0x4D555356),
        "bad-version": header(HEARTBEAT, version=VERSION - 1),
        "bad-reserved": header(HEARTBEAT)[:41] + b"\x01" + header(HEARTBEAT)[42:],
        "bad-flags-pull": header(PULL, flags=FLAG_ZERO),
        "bad-flags-pull-on-pull": header(PULL, flags=FLAG_PULL, dtype=FLOAT32, key=0x10000, rnd=1),
        "bad-push-length": header(PUSH, dtype=FLOAT32, count=10, payload_len=41),
        "bad-push-overflow": header(PUSH, dtype=FLOAT64, count=1 << 61, payload_len=0),
        "bad-push-collective": data_message(PUSH, FLOAT32, 1, aux=OP_SUM | 1 << 8),
        # ZERO and IPC together; a valid IPC push but for the ZERO bit
        "bad-flags-zero-ipc": header(PUSH, flags=FLAG_ZERO | FLAG_IPC, dtype=FLOAT32, count=256,
                                     payload_len=IPC_PAYLOAD) + IPC_REF,
        "bad-flags-ipc-pull": header(PULL, flags=FLAG_IPC, dtype=FLOAT32, key=0x10000, rnd=1),
        # IPC carries the 24-byte reference, not 4 bytes (nor count x dtype)
        "bad-push-ipc-length": header(PUSH, flags=FLAG_IPC, dtype=FLOAT32, count=1,
                                      payload_len=4) + u32(0x5C001000),
        "bad-push-ipc-overflow": header(PUSH, flags=FLAG_IPC, dtype=FLOAT32, count=(1 << 28) + 1,
                                        payload_len=IPC_PAYLOAD) + IPC_REF,
        "bad-register-host-too-long": message(REGISTER, reg_head + wstr("h" * 64) + reg_tail),
        "bad-register-host-nul": message(REGISTER, reg_head + wstr(b"10.0\x00.0.7") + reg_tail),
        "bad-register-host-id-too-long": message(REGISTER, reg_head + wstr("10.0.0.7") +
                                                 u32(31337) + wstr(HOST_ID_MAX + "x") + u32(-1) +
                                                 u32(0)),
        "bad-register-no-host-id": message(REGISTER, reg_head + wstr("10.0.0.7") + u32(31337)),
        "bad-register-rack": message(REGISTER, reg[:-8] + u32(-2) + u32(0)),
        "bad-register-resume-cut": message(REGISTER, reg_resume[:-4]),
        "bad-addrbook-truncated": message(ADDRBOOK, book[:-3]),
        "bad-short-header": header(BARRIER)[:20],
    }


def auth_seed(side, honest, replay=False, other_secret=False, why_size=200,
              secret=b"job-secret", hang_up_after=255, nonce=bytes(range(32)), mask=b""):
    """One fuzz_auth input (layout in fuzz_auth.c)."""
    mode = ((side == "connector") | (honest << 1) | (replay << 2) | (other_secret << 3))
    head = bytes([mode, why_size - 1, len(secret) - 1]) + secret + bytes([hang_up_after])
    return head + (nonce + mask if honest else mask)


def auth_seeds():
    flip = lambda at: bytes(at) + b"\x01"
    return {
        "acceptor-honest": auth_seed("acceptor", True),
        "acceptor-replay": auth_seed("acceptor", True, replay=True),
        "acceptor-other-secret": auth_seed("acceptor", True, other_secret=True),
        "acceptor-hangup-in-answer": auth_seed("acceptor", True, hang_up_after=40),
        "acceptor-flip-nonce": auth_seed("acceptor", True, mask=flip(3)),
        "acceptor-flip-tag": auth_seed("acceptor", True, mask=flip(40)),
        "acceptor-raw": auth_seed("acceptor", False, mask=bytes(64)),
        "acceptor-tiny-reason": auth_seed("acceptor", False, why_size=1, mask=b"junk"),
        "connector-honest": auth_seed("connector", True),
        "connector-other-secret": auth_seed("connector", True, other_secret=True),
        "connector-no-challenge": auth_seed("connector", True, hang_up_after=0),
        "connector-hangup-in-tag": auth_seed("connector", True, hang_up_after=50),
        "connector-flip-magic": auth_seed("connector", True, mask=flip(1)),
        "connector-flip-nonce": auth_seed("connector", True, mask=flip(10)),
        "connector-flip-tag": auth_seed("connector", True, mask=flip(60)),
        "connector-raw": auth_seed("connector", False, mask=b"USAU" + bytes(64)),
        "connector-tiny-reason": auth_seed("connector", False, why_size=2, mask=b"USAX"),
    }


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    here = os.path.dirname(os.path.abspath(__file__))
    root = args[0] if args else os.path.join(here, "corpus")
    differ = []
    written = 0
    for sub, blobs in (("wire", seeds()), ("auth", auth_seeds())):
        out = os.path.join(root, sub)
        if not check:
            os.makedirs(out, exist_ok=True)
        for name, blob in sorted(blobs.items()):
            path = os.path.join(out, name)
            if check:
                try:
                    with open(path, "rb") as f:
                        if f.read() != blob:
                            differ.append(sub + "/" + name)
                except OSError:
                    differ.append(sub + "/" + name)
            else:
                with open(path, "wb") as f:
                    f.write(blob)
                written += 1
    if check and differ:
        print("make_corpus: out of date: " + ", ".join(differ), file=sys.stderr)
        return 1
    if not check:
        print("make_corpus: wrote %d seeds to %s" % (written, root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
