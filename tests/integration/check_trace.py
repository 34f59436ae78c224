#!/usr/bin/python3
"""check_trace.py - checks a worker's timeline (UNISUM_TRACE_DIR/<rank>/comm.json).

    check_trace.py window FILE FIRST LAST TENSOR=NPARTS...
        The file is valid Chrome trace-event JSON; every partition of every
        named tensor has exactly one QUEUE, PUSH and PULL span in every
        round FIRST..LAST, and the tensor itself one span per round; no
        span of any round outside FIRST..LAST; spans have sane times.

    check_trace.py priority FILE URGENT BACKLOG CREDIT_PARTS
        The urgent tensor's PUSH left the queue right after the CREDIT_PARTS
        partitions of the backlog that were in flight when it was queued,
        although the backlog had many more queued ahead of it.

Prints one line per finding; exits 1 when a check fails.
"""
import collections
import json
import sys


def load(path):
    with open(path) as f:
        doc = json.load(f)  # raises on invalid JSON: the test fails
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = [e for e in events if e.get("ph") == "X"]
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] >= 0, e
    return events, spans


def window(path, first, last, tensors):
    events, spans = load(path)
    ok = True
    count = collections.Counter()
    for e in spans:
        a = e["args"]
        r = a["round"]
        if not first <= r <= last:
            print("span outside the window: %s" % e)
            ok = False
        if e["cat"] == "tensor":
            count[(a["tensor"], "TENSOR", None, r)] += 1
        else:
            count[(a["tensor"], e["name"], a["part"], r)] += 1
    for name, nparts in tensors.items():
        for r in range(first, last + 1):
            if count[(name, "TENSOR", None, r)] != 1:
                print("tensor %s round %d: %d tensor spans, want 1" %
                      (name, r, count[(name, "TENSOR", None, r)]))
                ok = False
            for p in range(nparts):
                for stage in ("QUEUE", "PUSH", "PULL"):
                    n = count[(name, stage, p, r)]
                    if n != 1:
                        print("tensor %s part %d round %d: %d %s spans, want 1" %
                              (name, p, r, n, stage))
                        ok = False
    names = [e for e in events if e.get("ph") == "M" and e["name"] == "thread_name"]
    if not names:
        print("no lane is named")
        ok = False
    print("%s: %d events, %d spans, rounds %d..%d" % (path, len(events), len(spans), first, last))
    return ok


def priority(path, urgent, backlog, credit_parts):
    _, spans = load(path)
    pushes = sorted((e["args"]["order"], e["args"]["tensor"]) for e in spans
                    if e["name"] == "PUSH")
    orders = [o for o, t in pushes if t == urgent]
    if len(orders) != 1:
        print("want one PUSH of %s, found %d" % (urgent, len(orders)))
        return False
    before = sum(1 for o, t in pushes if t == backlog and o < orders[0])
    total = sum(1 for o, t in pushes if t == backlog)
    print("%s went out after %d of %d %s partitions (credit: %d partitions)" %
          (urgent, before, total, backlog, credit_parts))
    return total > credit_parts + 1 and before == credit_parts


def main(argv):
    if len(argv) >= 4 and argv[0] == "window":
        tensors = dict((t.split("=")[0], int(t.split("=")[1])) for t in argv[4:])
        ok = window(argv[1], int(argv[2]), int(argv[3]), tensors)
    elif len(argv) == 5 and argv[0] == "priority":
        ok = priority(argv[1], argv[2], argv[3], int(argv[4]))
    else:
        print(__doc__)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
