#!/usr/bin/python3
"""check_architecture.py - docs/ARCHITECTURE.md names everything it must.

    /usr/bin/python3 tests/docs/check_architecture.py

The architecture document is the living design: every message type of
src/wire/wire.h, every environment variable (and alias) of the knob table in
src/config/config.c and every function of include/unisum.h must be named in
it.  docs/START_HERE.md, the map a newcomer starts from, must name every
source file of src/, tools/ and python/unisum/ (by its path), and no file
that is gone.  Fails naming each one that is not, and fails when it finds
nothing to check (a parser that broke must not pass).
"""
import glob
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def message_types():
    enum = re.search(r"enum wire_type \{(.*?)\};", read("src/wire/wire.h"), re.S).group(1)
    return [m for m in re.findall(r"^\s*WIRE_([A-Z_]+)\s*=\s*\d+", enum, re.M) if m != "TYPE_MAX"]


def knobs():
    table = read("src/config/config.c")
    names = []
    for row in re.findall(r'^\s*\{"((?:UNISUM|DMLC|BYTEPS)_[A-Z0-9_]+)",\s*([^,]+),\s*([^,]+),', table, re.M):
        names.append(row[0])
        names += [a.strip().strip('"') for a in row[1:] if a.strip() != "NULL"]
    return names


def functions():
    return sorted(set(re.findall(r"^[a-z][^\n(]*?\b(unisum_[a-z_]+)\(", read("include/unisum.h"), re.M)))


def source_files():
    paths = glob.glob(os.path.join(ROOT, "src", "**", "*.[ch]"), recursive=True)
    paths += glob.glob(os.path.join(ROOT, "tools", "*.[ch]"))
    paths += [p for p in glob.glob(os.path.join(ROOT, "python", "unisum", "**", "*.py"),
                                   recursive=True) if not p.endswith("_version.py")]
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def check_start_here():
    """The number of problems of docs/START_HERE.md's map, each printed."""
    doc = read("docs/START_HERE.md")
    files = source_files()
    named = set(re.findall(r"`((?:src|tools|python|include)/[\w./-]+)`", doc))
    # A line may name a file of its directory by its name alone (`_capi.py`).
    bare = set(re.findall(r"`([\w-]+\.(?:c|h|py))`", doc))
    problems = 0
    if not files or not named:
        print("FAIL found no source files or no named files: the parser no longer matches")
        return 1
    for f in files:
        if f not in named and os.path.basename(f) not in bare:
            print("FAIL docs/START_HERE.md does not name %s" % f)
            problems += 1
    for n in sorted(named):
        if not os.path.exists(os.path.join(ROOT, n)):
            print("FAIL docs/START_HERE.md names %s, which is gone" % n)
            problems += 1
    print("%d source files in docs/START_HERE.md's map; %d problems" % (len(files), problems))
    return problems


def main():
    doc = read("docs/ARCHITECTURE.md")
    groups = [("message types", message_types()), ("environment variables", knobs()),
              ("functions of unisum.h", functions())]
    missing = 0
    for what, names in groups:
        if not names:
            print("FAIL found no %s to check: the parser no longer matches the source" % what)
            missing += 1
        for name in names:
            if not re.search(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(name), doc):
                print("FAIL docs/ARCHITECTURE.md does not name %s (one of the %s)" % (name, what))
                missing += 1
    print("%s; %d missing" % (", ".join("%d %s" % (len(n), w) for w, n in groups), missing))
    missing += check_start_here()
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
