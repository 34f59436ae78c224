#!/usr/bin/python3
"""check_kubernetes.py - deploy/kubernetes/*.yaml against the code.

No Kubernetes cluster is at hand here, so the manifests are held to what
can be checked without one (tests/integration/test_nodes.sh runs the
environment contract itself, in network namespaces):

- every file parses as YAML;
- every variable a container sets is one unisum reads: a UNISUM_* knob of
  src/config/config.c, or one of the engine variables tools/launch_node.c
  reads (NNODES, NODE_RANK, MASTER_ADDR, ...);
- the numbers agree: the PyTorchJob's UNISUM_NUM_SERVER is its pods plus
  the CPU-only server replicas, the servers' UNISUM_NUM_WORKER is its pods
  and they look for the scheduler at the Master's Service; the
  StatefulSet's NNODES is its replicas and MASTER_ADDR its pod 0;
- the containers run `unisum launch --nproc-per-node`, `unisum server` or
  `unisum launch --scheduler`;
- scheduler.yaml's scheduler expects the nodes its StatefulSet runs (one
  server each), and they run no scheduler of their own and look for it at
  its Service.

Exits 1 naming each problem.
"""
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
problems = []


def known_variables():
    """The UNISUM_* knobs and the engine variables the launcher reads."""
    with open(os.path.join(ROOT, "src", "config", "config.c")) as f:
        knobs = set(re.findall(r'\{"(UNISUM_[A-Z0-9_]+)"', f.read()))
    with open(os.path.join(ROOT, "tools", "launch_node.c")) as f:
        node = f.read()
    engine = set()
    for arr in re.findall(r"_vars\[\] = \{([^}]*)\}", node):
        engine |= set(re.findall(r'"([A-Z_]+)"', arr))
    if not knobs or not {"MASTER_ADDR", "NNODES", "RANK"} <= engine:
        sys.exit("check_kubernetes: cannot read the variables of config.c or launch_node.c")
    return knobs | engine


def containers(doc):
    """(name, container) of every container in a manifest."""
    if doc.get("kind") == "PyTorchJob":
        for role, spec in doc["spec"]["pytorchReplicaSpecs"].items():
            for c in spec["template"]["spec"]["containers"]:
                yield "%s/%s" % (role, c["name"]), c
    elif doc.get("kind") in ("StatefulSet", "Deployment"):
        for c in doc["spec"]["template"]["spec"]["containers"]:
            yield "%s/%s" % (doc["metadata"]["name"], c["name"]), c


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def main():
    known = known_variables()
    docs = {}
    for name in sorted(os.listdir(DEPLOY)):
        if not name.endswith(".yaml"):
            continue
        try:
            with open(os.path.join(DEPLOY, name)) as f:
                docs[name] = [d for d in yaml.safe_load_all(f) if d]
        except yaml.YAMLError as e:
            problems.append("%s does not parse as YAML: %s" % (name, e))
    for need in ("pytorchjob.yaml", "cpu-servers.yaml", "statefulset.yaml", "scheduler.yaml"):
        if need not in docs:
            problems.append("deploy/kubernetes/%s is missing" % need)
    for name, ds in docs.items():
        for d in ds:
            for cname, c in containers(d):
                for var in env_of(c):
                    if var not in known:
                        problems.append("%s: %s sets %s, which unisum does not read" % (name, cname, var))
                cmd = " ".join(c.get("command", []))
                if ("unisum launch --nproc-per-node" not in cmd and
                        cmd not in ("unisum server", "unisum launch --scheduler")):
                    problems.append("%s: %s runs none of `unisum launch --nproc-per-node`, "
                                    "`unisum server`, `unisum launch --scheduler`: %s"
                                    % (name, cname, cmd))
    if not problems:
        check_numbers(docs)
    for p in problems:
        print("FAIL", p)
    print("%d manifest files, %d problem(s)" % (len(docs), len(problems)))
    return 1 if problems else 0


def check_numbers(docs):
    """The counts and addresses that must agree across the manifests."""
    job = next(d for d in docs["pytorchjob.yaml"] if d["kind"] == "PyTorchJob")
    specs = job["spec"]["pytorchReplicaSpecs"]
    pods = sum(s["replicas"] for s in specs.values())
    servers = next(d for d in docs["cpu-servers.yaml"] if d["kind"] == "StatefulSet")
    cpu = servers["spec"]["replicas"]
    for role, s in specs.items():
        for c in s["template"]["spec"]["containers"]:
            got = env_of(c).get("UNISUM_NUM_SERVER")
            if got != str(pods + cpu):
                problems.append("pytorchjob.yaml: %s's UNISUM_NUM_SERVER is %s, not its %d pods "
                                "plus the %d CPU-only servers" % (role, got, pods, cpu))
    senv = env_of(servers["spec"]["template"]["spec"]["containers"][0])
    if senv.get("UNISUM_NUM_WORKER") != str(pods) or senv.get("UNISUM_NUM_SERVER") != str(pods + cpu):
        problems.append("cpu-servers.yaml: UNISUM_NUM_WORKER %s and UNISUM_NUM_SERVER %s, not %d "
                        "and %d" % (senv.get("UNISUM_NUM_WORKER"), senv.get("UNISUM_NUM_SERVER"),
                                    pods, pods + cpu))
    master = job["metadata"]["name"] + "-master-0"
    if senv.get("UNISUM_SCHEDULER_HOST") != master:
        problems.append("cpu-servers.yaml: the scheduler is at %s (the Master's Service), not %s"
                        % (master, senv.get("UNISUM_SCHEDULER_HOST")))
    sts = next(d for d in docs["statefulset.yaml"] if d["kind"] == "StatefulSet")
    nenv = env_of(sts["spec"]["template"]["spec"]["containers"][0])
    if nenv.get("NNODES") != str(sts["spec"]["replicas"]):
        problems.append("statefulset.yaml: NNODES %s but %d replicas" % (nenv.get("NNODES"),
                                                                         sts["spec"]["replicas"]))
    pod0 = "%s-0.%s" % (sts["metadata"]["name"], sts["spec"]["serviceName"])
    if nenv.get("MASTER_ADDR") != pod0:
        problems.append("statefulset.yaml: MASTER_ADDR %s, not pod 0 (%s)" % (nenv.get("MASTER_ADDR"), pod0))
    check_scheduler(docs["scheduler.yaml"])


def check_scheduler(ds):
    """scheduler.yaml: the scheduler's job is its nodes', which find it."""
    dep = next(d for d in ds if d["kind"] == "Deployment")
    svc = next(d for d in ds if d["kind"] == "Service" and
               d["spec"].get("selector") == dep["spec"]["template"]["metadata"]["labels"])
    senv = env_of(dep["spec"]["template"]["spec"]["containers"][0])
    sts = next(d for d in ds if d["kind"] == "StatefulSet")
    node = sts["spec"]["template"]["spec"]["containers"][0]
    nenv = env_of(node)
    n = str(sts["spec"]["replicas"])
    if senv.get("UNISUM_NUM_WORKER") != n or senv.get("UNISUM_NUM_SERVER") != n or nenv.get("NNODES") != n:
        problems.append("scheduler.yaml: the scheduler expects %s machines and %s servers, the "
                        "nodes say NNODES %s, and there are %s"
                        % (senv.get("UNISUM_NUM_WORKER"), senv.get("UNISUM_NUM_SERVER"),
                           nenv.get("NNODES"), n))
    if nenv.get("MASTER_ADDR") != svc["metadata"]["name"] or \
            nenv.get("MASTER_PORT") != senv.get("UNISUM_SCHEDULER_PORT"):
        problems.append("scheduler.yaml: the nodes look for the scheduler at %s:%s, not its "
                        "Service %s:%s" % (nenv.get("MASTER_ADDR"), nenv.get("MASTER_PORT"),
                                           svc["metadata"]["name"], senv.get("UNISUM_SCHEDULER_PORT")))
    if "--no-scheduler" not in " ".join(node.get("command", [])):
        problems.append("scheduler.yaml: the nodes run a scheduler of their own (no --no-scheduler)")
    if nenv.get("UNISUM_TIMEOUT_MS") != senv.get("UNISUM_TIMEOUT_MS"):
        problems.append("scheduler.yaml: the nodes and the scheduler wait differently "
                        "(UNISUM_TIMEOUT_MS %s and %s)" % (nenv.get("UNISUM_TIMEOUT_MS"),
                                                          senv.get("UNISUM_TIMEOUT_MS")))


if __name__ == "__main__":
    sys.exit(main())
