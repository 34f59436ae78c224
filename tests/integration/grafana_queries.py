"""Every query of the Grafana dashboard, against a real Prometheus
(test_metrics.sh): each must parse and, but for the stalls (none while the
job is healthy), return data.

usage: grafana_queries.py PROMETHEUS_PORT DASHBOARD_JSON

Prints one line per query; exits 1 when one failed.
"""
import json
import sys
import urllib.parse
import urllib.request


def exprs(node):
    if isinstance(node, dict):
        if "expr" in node:
            yield node["expr"]
        for value in node.values():
            yield from exprs(value)
    elif isinstance(node, list):
        for value in node:
            yield from exprs(value)


def main():
    port, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        dashboard = json.load(f)
    failed = 0
    for expr in exprs(dashboard):
        query = expr.replace("$__rate_interval", "5s")
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                answer = json.load(r)
        except Exception as e:  # an HTTP 400 is a query that does not parse
            answer = {"status": f"error ({e})", "data": {"result": []}}
        series = len(answer["data"]["result"]) if answer["status"] == "success" else 0
        ok = answer["status"] == "success" and (series > 0 or "stall_seconds" in query)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {series:3d} series  {query}")
    sys.exit(1 if failed else 0)


main()
