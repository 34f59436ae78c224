#!/usr/bin/python3
"""check_commands.py - every external command the project runs comes from a
package that scripts/install-deps.sh installs, or from a minimal Debian 12.

    /usr/bin/python3 tests/deps/check_commands.py [--list] [--self-test]

The one list of allowed commands is the table in scripts/install-deps.sh
(`install-deps.sh --table` prints it): each line names a Debian package,
its group (`base`: part of a minimal Debian 12, never installed by us;
`test`: what `make demo`, `make test` and CI need; `bench`: what bench/
needs on top; `suite`: what Horovod's test suite needs, run by hand) and
the commands of that package that the project runs.  install-deps.sh
installs the `test` packages, and the `bench` and `suite` ones when
asked.

This check reads every shell script, Makefile recipe, CMake COMMAND and
Python/JavaScript/C file under the places that tests, the demo, CI and the
benchmarks run from, finds every command they run, and fails naming the
command (and where it is used) when

  - install-deps.sh's table does not list it;
  - the package it lists is a `base` one that is not of Priority
    `required` (what `debootstrap --variant=minbase` installs);
  - the package is installed and the command's file belongs to another
    package (the list would lie), or a `test` command is missing after
    install-deps.sh ran.

A word counts as a command where a shell would run it: the first word of a
simple command, the command behind a wrapper (`timeout 60 ping`, `env A=1
ip`, `ip netns exec NS iperf3`, `nsenter --net=F tc`, `sh -c '...'`, and
the scripts' own functions that run "$@", such as the test helper `expect
NAME CMD...`), a variable with a literal value (`"$CLANG"` after
`CLANG=${CLANG:-clang}`), and `command -v NAME`.  Other variables
(`"$UNISUM"`), relative paths and the project's own programs are not
external commands.  A path such as /usr/bin/chromium in any scanned file
is the command chromium, and so is the first literal of an argument list
given to Python's subprocess.

--list prints every command found with its first use; --self-test runs the
scanner over small scripts with a known answer (make test runs it first, so
a scanner that finds nothing cannot pass).
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INSTALL_DEPS = os.path.join(ROOT, "scripts", "install-deps.sh")

# What a test, the demo, CI or a benchmark runs: the places to scan.
# tools/: the commands `unisum launch` runs (ssh, srun, scontrol).
SCAN_DIRS = ["tests", "bench", "scripts", "examples", ".ci", "tools"]
SCAN_FILES = ["Makefile", "CMakeLists.txt"]
# Shell builtins and keywords (POSIX sh, dash and bash), never external.
BUILTINS = set("""
    . : [ [[ ]] alias bg break cd command continue echo eval exec exit export
    false fg getopts hash jobs kill local printf pwd read readonly return set
    shift source test times trap true type ulimit umask unalias unset wait
    let declare typeset shopt pushd popd disown
    if then else elif fi do done while until for in case esac function ! { }
    """.split())
# Programs that run another one: how many words (after their options) come
# before the command they run.  Options taking a value are named.
WRAPPERS = {
    "timeout": (1, {"-s", "--signal", "-k", "--kill-after"}),
    "env": (0, {"-u", "--unset", "-C", "--chdir", "-S"}),
    "nohup": (0, set()),
    "setsid": (0, set()),
    "nice": (0, {"-n", "--adjustment"}),
    "stdbuf": (0, {"-i", "-o", "-e"}),
    "xargs": (0, {"-n", "-I", "-P", "-L", "-d", "-s", "-a", "-E"}),
    "nsenter": (0, {"-t", "--target", "-S", "-G", "--setuid", "--setgid"}),
    "unshare": (0, set()),
    "chroot": (1, set()),
    "exec": (0, {"-a"}),
    "sudo": (0, {"-u", "-g"}),
}
# Shell functions of the scanned scripts that run their arguments as a
# command ("$@" after N shifts: lib.sh's `expect NAME CMD...`): name -> N.
# Filled by find_commands() before the scan.
RUNNERS = {}
SHELLS = {"sh", "bash", "dash"}
FIRST_WORD_ONLY = object()


class Finding:
    def __init__(self, name, where):
        self.name, self.where = name, where


# --- a small shell lexer -------------------------------------------------
#
# Splits a script into simple commands (lists of words), enough of the POSIX
# grammar for what a build's scripts hold: quotes, escapes, comments,
# $(...), `...`, $((...)), ${...}, here-documents, the list and pipeline
# operators, ( ) { } groups, functions, case clauses and redirections.
# Command substitutions are scanned as scripts of their own.

OPS = ["&&", "||", ";;", "|&", ";", "&", "|", "(", ")", "\n"]
REDIR = re.compile(r"^[0-9]*(>>|>&|<&|<<-|<<<|<<|<>|>\||>|<)")


class Lexer:
    def __init__(self, text, path, line0, out, variables):
        self.s, self.i, self.path, self.line, self.out = text, 0, path, line0, out
        self.vars = variables  # NAME -> its literal value, for "$NAME" as a command
        self.heredocs = []  # delimiters waiting for the next newline

    def where(self):
        return "%s:%d" % (os.path.relpath(self.path, ROOT), self.line)

    def sub(self, text, line):
        """Scans a command substitution's text as a script of its own."""
        scan_shell(text, self.path, line, self.out, self.vars)

    def read_until_paren(self):
        """After '$(' : the text up to the matching ')'."""
        depth, start = 1, self.i
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\":
                self.i += 2
                continue
            if c == "'":
                j = self.s.find("'", self.i + 1)
                self.i = len(self.s) if j < 0 else j + 1
                continue
            if c == '"':
                self.read_dquote()
                continue
            if c == "\n":
                self.line += 1
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return self.s[start:self.i - 1]
            self.i += 1
        return self.s[start:]

    def read_dquote(self):
        """At '"': skips to after the closing quote, scanning $(...) inside."""
        self.i += 1
        buf = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\":
                nxt = self.s[self.i + 1:self.i + 2]
                buf.append(nxt if nxt in '$`"\\\n' else "\\" + nxt)
                self.i += 2
                continue
            if c == '"':
                self.i += 1
                break
            if c == "\n":
                self.line += 1
            if self.s.startswith("$((", self.i):
                self.i += 3
                self.read_until_paren()
                self.i += 1
                continue
            if self.s.startswith("$(", self.i):
                line = self.line
                self.i += 2
                self.sub(self.read_until_paren(), line)
                continue
            if c == "`":
                j = self.s.find("`", self.i + 1)
                j = len(self.s) if j < 0 else j
                self.sub(self.s[self.i + 1:j], self.line)
                self.i = j + 1
                continue
            buf.append(c)
            self.i += 1
        return "".join(buf)

    def tokens(self):
        """Yields (kind, text, quoted): kind is 'op' or 'word'."""
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\\" and s.startswith("\\\n", self.i):
                self.i += 2
                self.line += 1
                continue
            if c in " \t\r":
                self.i += 1
                continue
            if c == "#":
                j = s.find("\n", self.i)
                self.i = len(s) if j < 0 else j
                continue
            if c == "\n":
                self.i += 1
                self.line += 1
                self.skip_heredocs()
                yield ("op", "\n", False)
                continue
            op = next((o for o in OPS if s.startswith(o, self.i)), None)
            if op:
                self.i += len(op)
                yield ("op", op, False)
                continue
            m = REDIR.match(s[self.i:])
            if m:
                self.i += m.end()
                if m.group(1) in ("<<", "<<-"):
                    word, _ = self.word()
                    self.heredocs.append(word)
                elif m.group(1) in (">&", "<&") and re.match(r"[0-9-]", s[self.i:self.i + 1] or " "):
                    self.word()
                else:
                    while self.i < len(s) and s[self.i] in " \t":
                        self.i += 1
                    self.word()
                continue
            text, quoted = self.word()
            yield ("word", text, quoted)

    def word(self):
        """Reads one word; returns its text with quotes removed, and whether
        any part of it was quoted or came from an expansion."""
        s, buf, quoted = self.s, [], False
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r\n;&|()<>":
                break
            if c == "\\":
                buf.append(s[self.i + 1:self.i + 2])
                self.i += 2
                continue
            if c == "'":
                j = s.find("'", self.i + 1)
                j = len(s) if j < 0 else j
                buf.append(s[self.i + 1:j])
                self.line += s.count("\n", self.i, j)
                self.i = j + 1
                quoted = True
                continue
            if c == '"':
                buf.append(self.read_dquote())
                quoted = True
                continue
            if s.startswith("$((", self.i):
                self.i += 3
                self.read_until_paren()
                self.i += 1
                buf.append("$N")
                continue
            if s.startswith("$(", self.i):
                line = self.line
                self.i += 2
                self.sub(self.read_until_paren(), line)
                buf.append("$S")
                continue
            if c == "`":
                j = s.find("`", self.i + 1)
                j = len(s) if j < 0 else j
                self.sub(s[self.i + 1:j], self.line)
                self.i = j + 1
                buf.append("$S")
                continue
            if s.startswith("${", self.i):
                j = s.find("}", self.i)
                j = len(s) if j < 0 else j
                buf.append(s[self.i:j + 1])
                self.i = j + 1
                continue
            buf.append(c)
            self.i += 1
        return "".join(buf), quoted

    def skip_heredocs(self):
        """After a newline: skips the bodies of pending here-documents."""
        for delim in self.heredocs:
            while self.i < len(self.s):
                j = self.s.find("\n", self.i)
                j = len(self.s) if j < 0 else j
                line = self.s[self.i:j]
                self.i = j + 1
                self.line += 1
                if line.strip() == delim:
                    break
        self.heredocs = []


def scan_shell(text, path, line0, out, variables=None):
    """Adds a Finding to out for every command the script text runs.
    variables maps a shell variable to the literal value the script gave it
    (shared by the scans of one file)."""
    lx = Lexer(text, path, line0, out, {} if variables is None else variables)
    words, start = [], lx.line
    in_case, want_pattern = 0, False

    def flush():
        if words:
            command_of(words, lx, out, start)
        words.clear()

    for kind, text_, quoted in lx.tokens():
        if want_pattern:
            # A case clause: pattern words up to ')' are no commands.
            if kind == "word" and text_ == "esac" and not quoted:
                in_case -= 1
                want_pattern = False
            elif kind == "op" and text_ == ")":
                want_pattern = False
            continue
        if kind == "op":
            if text_ == "(" and len(words) == 1:  # name() { ...: a function
                words.clear()
                continue
            flush()
            if text_ == ";;" and in_case:
                want_pattern = True
            start = lx.line
            continue
        if not words and not quoted:
            if text_ == "case":
                words.append(text_)
                continue
        if words and words[0] == "case" and text_ == "in" and not quoted:
            words.clear()
            in_case += 1
            want_pattern = True
            continue
        if not words and not quoted and text_ == "esac":
            in_case -= 1
            continue
        words.append(text_)
    flush()


def command_of(words, lx, out, line):
    """The command a simple command (its words) runs, through wrappers."""
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("if", "then", "else", "elif", "do", "while", "until", "!", "{", "}",
                 "time", "fi", "done"):
            i += 1
            continue
        if w in ("for", "select", "case", "function"):
            return
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w):  # an assignment
            i += 1
            continue
        break
    if i >= len(words):
        for w in words:  # only assignments: remember literal values
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", w, re.S)
            if m:
                lx.vars.setdefault(m.group(1), m.group(2))
        return
    name, args = words[i], words[i + 1:]
    m = re.match(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$", name)
    if m and m.group(1) in lx.vars:
        # "$CLANG" after CLANG=${CLANG:-clang}, $MPIRUN after MPIRUN="mpirun ...".
        value = lx.vars[m.group(1)]
        d = re.match(r"^\$\{[A-Za-z_][A-Za-z0-9_]*:?-(.*)\}$", value)
        value = (d.group(1) if d else value).split()
        if not value:  # $SUDO after SUDO="": the next word is the command
            return command_of(args, lx, out, line)
        name = value[0]
    where = "%s:%d" % (os.path.relpath(lx.path, ROOT), line)
    if name == "command" and args[:1] in (["-v"], ["-V"]):
        if len(args) > 1:
            add(args[1], where, out)
        return
    if name == "command":
        return command_of(args, lx, out, line)
    if name in SHELLS and "-c" in args:
        j = args.index("-c")
        if j + 1 < len(args):
            scan_shell(args[j + 1], lx.path, line, out, lx.vars)
        return
    if name == "ip" and args[:2] == ["netns", "exec"] and len(args) > 3:
        add(name, where, out)
        return command_of(args[3:], lx, out, line)
    if name == "$@":
        out.append(Finding(name, where))  # marks a function as a runner
        return
    if name in RUNNERS:
        if len(args) > RUNNERS[name]:
            command_of(args[RUNNERS[name]:], lx, out, line)
        return
    if name in WRAPPERS:
        add(name, where, out)
        skip, valued = WRAPPERS[name]
        j = 0
        while j < len(args):
            a = args[j]
            if a == "--":
                j += 1
                break
            if a.startswith("-") and len(a) > 1:
                j += 2 if a in valued else 1
                continue
            if name == "env" and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", a):
                j += 1
                continue
            break
        j += skip
        if j < len(args):
            command_of(args[j:], lx, out, line)
        return
    add(name, where, out)


def add(name, where, out):
    """Records a command word unless it is a variable, a builtin, a
    function or a path inside the project."""
    if not name or "$" in name or name in BUILTINS:
        return
    if name.startswith("/"):
        m = re.match(r"^/(?:usr/)?s?bin/([A-Za-z0-9_.+-]+)$", name)
        if not m:
            return
        name = m.group(1)
    elif "/" in name or not re.match(r"^[A-Za-z0-9_.+-]+$", name):
        return
    out.append(Finding(name, where))


# --- the files ---------------------------------------------------------


def files_to_scan():
    for d in SCAN_DIRS:
        for top, dirs, files in os.walk(os.path.join(ROOT, d)):
            dirs[:] = [x for x in dirs if x not in ("corpus", "results", "node_modules", "__pycache__")]
            for f in sorted(files):
                yield os.path.join(top, f)
    for f in SCAN_FILES:
        yield os.path.join(ROOT, f)


def kind_of(path, head):
    base = os.path.basename(path)
    if base == "Makefile":
        return "make"
    if base == "CMakeLists.txt":
        return "cmake"
    if path.endswith(".sh") or re.match(r"#!.*\b(sh|bash|dash)\b", head):
        return "sh"
    if path.endswith(".py") or head.startswith("#!") and "python" in head:
        return "py"
    if path.endswith((".c", ".h", ".mjs", ".js")):
        return "text"
    return None


# Python: the literal first element of an argument list given to subprocess
# or os.exec*, and shutil.which("NAME").
PY_CALL = re.compile(r"(?:subprocess\.\w+|Popen|check_output|check_call|os\.exec\w+|shutil\.which)"
                     r"\(\s*\[?\s*['\"]([^'\"]+)['\"]")
C_ARGV0 = re.compile(r"\bpre\[\] = \{ \"([a-z][\w.+-]*)\"")
C_POPEN = re.compile(r"\bsnprintf\(cmd, [^,]+, \"([a-z][\w.+-]*) ")
PATH_LITERAL = re.compile(r"['\"](/(?:usr/)?s?bin/[A-Za-z0-9_.+-]+)['\"]")


def scan_file(path, out):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, OSError):
        return
    kind = kind_of(path, text[:200])
    rel = os.path.relpath(path, ROOT)
    if kind == "sh":
        scan_shell(text, path, 1, out)
    elif kind == "make":
        # Recipe lines, with make's $(VAR) as shell variables and make's
        # own assignments as their values.
        variables = {}
        for n, line in enumerate(text.split("\n"), 1):
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*[?:]?=\s*(.*)$", line)
            if m:
                variables[m.group(1)] = m.group(2)
            elif line.startswith("\t"):
                body = re.sub(r"\$\(([A-Za-z_]+)\)", r"${\1}", line.strip().lstrip("@-+"))
                scan_shell(body, path, n, out, variables)
    elif kind == "cmake":
        # A COMMAND that names one of the file's own executables runs what
        # the build made, not a package's.
        targets = set(re.findall(r"\badd_executable\((\w+)", text))
        for n, line in enumerate(text.split("\n"), 1):
            for m in re.finditer(r"\bCOMMAND\s+(\S+)", line):
                if m.group(1) not in targets:
                    add(m.group(1), "%s:%d" % (rel, n), out)
    if kind in ("py", "text"):
        for n, line in enumerate(text.split("\n"), 1):
            if re.match(r"^\s*(#|//|\*|/\*)", line):
                continue  # a comment names, it does not run
            if path.endswith(".c"):
                # C: the program of a command for exec (`pre[] = { "ssh",
                # ...`: launch_transport_argv), and a command line built
                # for popen() in `cmd`.
                for m in (C_ARGV0.search(line), C_POPEN.search(line)):
                    if m:
                        add(m.group(1), "%s:%d" % (rel, n), out)
            for m in PY_CALL.finditer(line) if kind == "py" else ():
                add(m.group(1), "%s:%d" % (rel, n), out)
            for m in PATH_LITERAL.finditer(line):
                add(m.group(1), "%s:%d" % (rel, n), out)
    elif kind in ("sh", "make"):
        for n, line in enumerate(text.split("\n"), 1):
            for m in PATH_LITERAL.finditer(line):
                add(m.group(1), "%s:%d" % (rel, n), out)


FUNCTION = re.compile(r"^[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(\)[ \t]*\{(.*?)(?:^\}|\}[ \t]*$)", re.M | re.S)


def functions_defined(texts):
    """The shell functions the script texts define: {name: N} for those
    that run their arguments after N shifts, {name: None} for the rest."""
    funcs = {}
    for text in texts:
        for m in FUNCTION.finditer(text):
            body, out = m.group(2), []
            scan_shell(body, os.path.join(ROOT, "function"), 1, out)
            runs_args = any(f.name == "$@" for f in out)
            shifts = sum(int(n or 1) for n in re.findall(r"(?:^|[;{])[ \t]*shift(?:[ \t]+([0-9]+))?[ \t]*(?=$|;)", body, re.M))
            funcs[m.group(1)] = shifts if runs_args else None
    return funcs


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return ""


def find_commands():
    """{command: first place it is used}, over every scanned file."""
    paths = list(files_to_scan())
    funcs = functions_defined(read_text(p) for p in paths
                              if kind_of(p, read_text(p)[:200]) in ("sh", "make"))
    RUNNERS.clear()
    RUNNERS.update({k: v for k, v in funcs.items() if v is not None})
    out = []
    for p in paths:
        scan_file(p, out)
    found = {}
    for f in out:
        if f.name not in funcs and f.name != "$@":
            found.setdefault(f.name, f.where)
    return found


# --- the list and the packages -------------------------------------------


def read_deps():
    """install-deps.sh's table as {command: (package, group)} and
    [(package, group)]."""
    commands, packages = {}, []
    table = subprocess.run(["sh", INSTALL_DEPS, "--table"], capture_output=True, text=True,
                           check=True).stdout
    for line in table.split("\n"):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) < 2 or words[1] not in ("base", "test", "bench", "suite"):
            sys.exit("install-deps.sh's table: expected 'PACKAGE base|test|bench|suite "
                     "[COMMAND...]', "
                     "got %r" % line)
        pkg, group = words[0], words[1]
        packages.append((pkg, group))
        for c in words[2:]:
            if c in commands:
                sys.exit("install-deps.sh's table lists command %s twice" % c)
            commands[c] = (pkg, group)
    return commands, packages


class Dpkg:
    """What dpkg and apt say about the packages and commands of the table,
    asked once each (a dpkg-query -S alone takes a tenth of a second)."""

    def __init__(self, commands, packages):
        names = sorted({p for p, _ in packages} | {p for p, _ in commands.values()})
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Priority} ${Status}\n"] + names,
                             capture_output=True, text=True).stdout
        self.priority, self.installed = {}, set()
        for line in out.split("\n"):
            w = line.split()
            if len(w) >= 2:
                self.priority[w[0]] = w[1]
                if line.endswith(" installed"):
                    self.installed.add(w[0])
        # Every file a command could be: /usr/bin/NAME and its kin, and
        # what they link to (an alternative), with and without /usr.
        self.paths = {}
        for name in commands:
            for d in ("/usr/bin", "/usr/sbin", "/bin", "/sbin"):
                path = os.path.join(d, name)
                if os.path.exists(path):
                    self.paths[name] = [alt for cand in (path, os.path.realpath(path))
                                        for alt in (cand, re.sub(r"^/usr/", "/", cand), "/usr" + cand)]
                    break
        wanted = sorted({x for v in self.paths.values() for x in v})
        out = subprocess.run(["dpkg-query", "-S"] + wanted, capture_output=True, text=True).stdout \
            if wanted else ""
        self.owners = {}
        for line in out.split("\n"):
            if ":" in line and not line.startswith("diversion by"):
                pkgs, path = line.split(": ", 1)
                # "pkgconf:amd64": the package, without its architecture.
                self.owners.setdefault(path.strip(), pkgs.split(",")[0].strip().split(":")[0])
        missing = [p for p in names if p not in self.installed]
        out = subprocess.run(["apt-cache", "policy"] + missing, capture_output=True, text=True).stdout \
            if missing else ""
        self.candidates = {m.group(1) for m in re.finditer(r"^(\S+):\n\s+Installed: .*\n\s+Candidate: (?!\(none\))",
                                                            out, re.M)}

    def owner_of(self, command):
        """The package that ships /usr/bin/COMMAND (or sbin, or /bin), or
        else the file it links to; None when there is no such file."""
        if command not in self.paths:
            return None
        for path in self.paths[command]:
            if path in self.owners:
                return self.owners[path]
        return "(no package: %s)" % self.paths[command][0]


def check(found, commands, packages, dpkg):
    """The problems with found ({command: where}) against the table, with
    what dpkg (a Dpkg of the same table) says."""
    errors = []
    for name, where in sorted(found.items()):
        if name not in commands:
            errors.append("command %s (first used at %s) is not in install-deps.sh's table: add "
                          "the Debian package that provides it (dpkg -S \"$(command -v %s)\") "
                          "with the command, so that install-deps.sh installs it" % (name, where, name))
    for pkg, group in sorted(set(packages)):
        installed = pkg in dpkg.installed
        if group == "base" and dpkg.priority.get(pkg) != "required":
            errors.append("package %s is listed as base (minimal Debian 12), but its priority "
                          "is %s, not required: list it as test or bench" %
                          (pkg, dpkg.priority.get(pkg) or "unknown (not installed)"))
        elif group == "test" and not installed:
            errors.append("package %s is not installed: scripts/install-deps.sh did not run "
                          "or failed" % pkg)
        elif group in ("bench", "suite") and not installed and pkg not in dpkg.candidates:
            errors.append("package %s (%s) is not one apt can install" % (pkg, group))
    for name, (pkg, group) in sorted(commands.items()):
        if name not in found:
            errors.append("install-deps.sh's table lists command %s (package %s), which nothing "
                          "runs any more: drop it" % (name, pkg))
            continue
        if pkg not in dpkg.installed:
            continue
        owner = dpkg.owner_of(name)
        if owner is None:
            errors.append("command %s (used at %s) is missing, yet package %s is installed: "
                          "it does not provide it" % (name, found[name], pkg))
        elif owner != pkg:
            errors.append("command %s (used at %s) comes from package %s, but install-deps.sh's "
                          "table says %s" % (name, found[name], owner, pkg))
    return errors


# --- self-test ------------------------------------------------------------

SELF_TEST = [
    ("ping -c 1 x", {"ping"}),
    ("a=1 b=$(date +%s) timeout 5 env X=1 ping -c1 host >/dev/null 2>&1 &", {"date", "timeout", "env", "ping"}),
    ("ip netns exec ns iperf3 -s | tee log", {"ip", "iperf3", "tee"}),
    ("nsenter --net=/run/netns/x -t 1 tc qdisc show", {"nsenter", "tc"}),
    ("sh -c 'gnuplot x; \"$0\" y' z", {"gnuplot"}),
    ("f() { frob; }\nf", {"frob"}),
    ("case $x in\n a|b) mpirun -n 2 ;;\n *) exit 1 ;;\nesac\nwget", {"mpirun", "wget"}),
    ("for i in $(seq 3); do\n  echo \"$(hostname -I)\" && \"$UNISUM\" launch\ndone", {"seq", "hostname"}),
    ("cat <<EOF\nnotacommand here\nEOF\nawk 1", {"cat", "awk"}),
    ("if command -v chromium >/dev/null; then :; fi  # grep nothing", {"chromium"}),
    ("expect() { n=$1; shift; \"$@\"; }\nexpect \"--name\" pgrep -f x\ntwo() { shift 2\n timeout 9 \"$@\"\n}\n"
     "two a b curl -s", {"pgrep", "curl", "timeout"}),
    ("x=\"a $(stat -c %s f)\" ./local-tool; /usr/bin/python3 -c 1", {"stat", "python3"}),
    ("echo \"it's\" 'a $(nope)' `uname -r` $((1 + 2))", {"uname"}),
    ("CC=${CC:-clang}\nM=\"mpirun -n 2\"\nE=\"\"\n\"$CC\" x.c; $M ./a; \"$UNKNOWN\" x; $E apt-get", {"clang", "mpirun", "apt-get"}),
    ("sh -c \"[ \\\"\\$(grep -c ok \\\"\\$1\\\")\\\" -eq 2 ]\" - x", {"grep"}),
]


def self_test():
    bad = 0
    for script, want in SELF_TEST:
        funcs = functions_defined([script])
        RUNNERS.clear()
        RUNNERS.update({k: v for k, v in funcs.items() if v is not None})
        out = []
        scan_shell(script, os.path.join(ROOT, "self-test"), 1, out)
        got = {f.name for f in out} - set(funcs) - {"$@"}
        if got != want:
            bad += 1
            print("FAIL self-test: %r found %s, expected %s" % (script, sorted(got), sorted(want)))
    print("self-test: %d of %d scripts scanned as expected" % (len(SELF_TEST) - bad, len(SELF_TEST)))
    return bad == 0


def main():
    if "--self-test" in sys.argv:
        sys.exit(0 if self_test() else 1)
    if "--list" in sys.argv:
        commands, _ = read_deps()
        for name, where in sorted(find_commands().items()):
            print("%-16s %-22s %s" % (name, commands.get(name, ("?",))[0], where))
        return
    if not self_test():
        sys.exit(1)
    found = find_commands()
    commands, packages = read_deps()
    # The check itself must bite: a command nobody lists, and a listed one
    # credited to the wrong package, are both caught.
    dpkg = Dpkg(commands, packages)
    planted = check(dict(found, frobnicate="tests/x.sh:1"), commands, packages, dpkg)
    mislabeled = check(found, dict(commands, sed=("grep", "base")), packages, dpkg)
    if not any("command frobnicate (first used at tests/x.sh:1)" in e for e in planted) or \
            not any("command sed " in e and "comes from package sed" in e for e in mislabeled):
        print("FAIL self-test: the check missed a planted unknown command or a wrong package")
        sys.exit(1)
    errors = check(found, commands, packages, dpkg)
    for e in errors:
        print("FAIL " + e)
    print("%d commands run by the tests, the demo, CI and the benchmarks; %d problem(s)" %
          (len(found), len(errors)))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
