# Integration: the scheduler's metrics (issue 54).  One job of two
# machines (4 workers, 2 per machine, 2 servers) under `unisum launch
# --metrics=PORT`, read while it runs:
# - /metrics twice: the counters grow, promtool accepts the text, and the
#   bytes each worker pushed to each server are what unisum_get_stats says
#   (the workers write theirs and wait: CHECK_SUMS_HOLD), which is also what
#   each server says it received;
# - the live page in headless Chromium: its plots have data (the body's
#   data-* counts), a screenshot in the build directory for a person;
# - `unisum top JOB` under tmux: capture-pane shows every rank;
# - a real Prometheus scraping the job answers every query of the Grafana
#   dashboard (deploy/grafana/unisum.json) with data;
# - bad requests (metrics_probe.py), and a second job asking for the same
#   port fails at start naming UNISUM_METRICS_PORT, as does a standalone
#   scheduler given it in the environment;
# and the job, unharmed, ends with every sum right.  Then a job whose
# worker 1 stops: its stall is named in the metrics while it lasts.
. "$(dirname "$0")/lib.sh"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
PY=/usr/bin/python3
SESSION=unisum-metrics-$$
trap 'tmux kill-session -t "$SESSION" 2>/dev/null; rm -rf "$TMP"' EXIT
for tool in curl promtool prometheus chromium tmux; do
	command -v "$tool" >/dev/null || { skip "$tool is not installed (scripts/install-deps.sh)"; finish; }
done

PORT=$(free_port)
JOB=metrics$$
ROUNDS=1500
[ "${UNISUM_TEST_LIGHT:-0}" = 1 ] && ROUNDS=300	# the sanitizer runs
URL=http://127.0.0.1:$PORT
mkdir "$TMP/hold"
(
	UNISUM_JOB_ID=$JOB UNISUM_HEARTBEAT_MS=200 CHECK_SUMS_HOLD="$TMP/hold" timeout 180 \
		"$UNISUM" launch --metrics="$PORT" -w 4 --local-size 2 -s 2 -- "$CHECK" failover "$ROUNDS" \
		>"$TMP/job.out" 2>&1
	echo $? >"$TMP/job.rc"
) &
JOB_PID=$!

# total FILE NAME REGEX : the sum of the values of NAME's series whose
# labels match REGEX.
total() {
	grep "^$2{" "$1" | grep -E -- "$3" | awk '{ s += $NF } END { printf "%.0f\n", s }'
}

# The first read, as soon as a worker has completed an operation.
ops=0
for _ in $(seq 150); do
	curl -s --max-time 5 "$URL/metrics" >"$TMP/s1" 2>/dev/null &&
		ops=$(total "$TMP/s1" unisum_worker_operations_total .)
	[ "${ops:-0}" -gt 0 ] && break
	sleep 0.2
done
expect "the metrics are served while the job runs (operations: $ops)" [ "${ops:-0}" -gt 0 ]
expect "promtool check metrics accepts them" sh -c "promtool check metrics <'$TMP/s1'"
expect "every rank is labelled" [ "$(grep -c '^unisum_node_up{role="worker"' "$TMP/s1")" = 4 ]
expect "the job file names the port" grep -q ":$PORT\$" "/tmp/unisum-$(id -u)/$JOB.metrics"

# The browser, Prometheus, the dashboard's queries, the screenshot (for a
# person) and `unisum top` in tmux (3 s of a terminal) are the plain
# run's: none of them runs unisum's C code beyond the HTTP requests the
# sanitizer runs make with curl and metrics_probe.py (make test's 10
# minutes).  Those fetch the page itself instead.
PROM_PID=
if [ "${UNISUM_TEST_LIGHT:-0}" = 1 ]; then
	curl -s --max-time 5 "$URL/" >"$TMP/page.html"
	expect "the live page is served" grep -q "data-scrapes" "$TMP/page.html"
else
	# A real Prometheus scrapes the job meanwhile, for the dashboard's queries.
	PROM_PORT=$(free_port)
	printf 'global: {scrape_interval: 500ms}\nscrape_configs:\n  - job_name: unisum\n    static_configs: [{targets: ["127.0.0.1:%s"]}]\n' \
		"$PORT" >"$TMP/prometheus.yml"
	timeout 120 prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
		--web.listen-address="127.0.0.1:$PROM_PORT" >"$TMP/prometheus.log" 2>&1 &
	PROM_PID=$!

	# The live page, in a real browser.
	chromium --headless=new --no-sandbox --disable-gpu --virtual-time-budget=6000 \
		--dump-dom "$URL/" >"$TMP/dom.html" 2>"$TMP/chromium.err"
	attr() { sed -n "s/.*$1=\"\\([0-9]*\\)\".*/\\1/p" "$TMP/dom.html" | head -n 1; }
	expect "the page scraped the metrics ($(attr data-scrapes) times)" [ "$(attr data-scrapes)" -ge 2 ]
	expect "the step time plot has points ($(attr data-step-points))" [ "$(attr data-step-points)" -gt 0 ]
	expect "the server plot has bars ($(attr data-server-points))" [ "$(attr data-server-points)" -gt 0 ]

	chromium --headless=new --no-sandbox --disable-gpu --virtual-time-budget=4000 \
		--window-size=1280,1000 --screenshot="$BUILD/metrics_page.png" "$URL/" \
		2>>"$TMP/chromium.err"
	expect "a screenshot of the page is in the build directory" [ -s "$BUILD/metrics_page.png" ]

	# unisum top, in a terminal.
	tmux new-session -d -s "$SESSION" -x 160 -y 40 "'$UNISUM' top $JOB"
	sleep 3
	tmux capture-pane -p -t "$SESSION" >"$TMP/top.txt"
	tmux kill-session -t "$SESSION"
	rows=$(grep -c -E '^(worker +[0-3]|server +[01]) ' "$TMP/top.txt")
	expect "unisum top shows every rank ($rows rows of 6)" [ "$rows" = 6 ]
	[ "$rows" = 6 ] || sed 's/^/    /' "$TMP/top.txt"
fi

# Bad requests are refused, and the port stays the scheduler's.
$PY "$REPO/tests/integration/metrics_probe.py" "$PORT" >"$TMP/probe.txt" 2>&1
expect "bad requests are refused" [ $? -eq 0 ]
sed 's/^/    /' "$TMP/probe.txt"
timeout 60 "$UNISUM" launch --metrics="$PORT" -w 1 -s 1 -- "$CHECK" once >"$TMP/taken.out" 2>&1
expect "a job given a taken metrics port fails at start" [ $? -ne 0 ]
expect "... naming UNISUM_METRICS_PORT" grep -q "UNISUM_METRICS_PORT=$PORT" "$TMP/taken.out"
UNISUM_METRICS_PORT=$PORT UNISUM_ROLE=scheduler UNISUM_NUM_WORKER=1 UNISUM_NUM_SERVER=1 \
	UNISUM_SCHEDULER_PORT=$(free_port) timeout 30 "$UNISUM" scheduler >"$TMP/sched.out" 2>&1
expect "a scheduler given a taken metrics port fails at start, naming it" \
	grep -q "UNISUM_METRICS_PORT=$PORT" "$TMP/sched.out"

# Every query of the Grafana dashboard returns data from that Prometheus.
if [ -n "$PROM_PID" ]; then
	$PY "$REPO/tests/integration/grafana_queries.py" "$PROM_PORT" "$REPO/deploy/grafana/unisum.json" \
		>"$TMP/queries.txt" 2>&1
	expect "every query of deploy/grafana/unisum.json works on a real Prometheus" [ $? -eq 0 ]
	grep -v '^ok' "$TMP/queries.txt" | sed 's/^/    /'
	kill "$PROM_PID" 2>/dev/null
	wait "$PROM_PID" 2>/dev/null
fi

# The second read, once every worker's counts are final (5 heartbeats).
for _ in $(seq 300); do
	[ "$(ls "$TMP/hold" | grep -c '^rank[0-9]*$')" = 4 ] && break
	sleep 0.2
done
sleep 1
curl -s --max-time 5 "$URL/metrics" >"$TMP/s2"
ops2=$(total "$TMP/s2" unisum_worker_operations_total .)
expect "the counters grew ($ops, then $ops2 operations)" [ "${ops2:-0}" -gt "$ops" ]
for s in 0 1; do
	stats=$(cat "$TMP/hold"/rank* | awk -v s=$s '$1 == s { t += $2 } END { printf "%.0f\n", t }')
	pushed=$(total "$TMP/s2" unisum_pushed_to_server_bytes_total "server=\"$s\"")
	got=$(total "$TMP/s2" unisum_server_received_bytes_total "role=\"server\",rank=\"$s\"")
	expect "server $s: the workers' metrics say $pushed bytes, get_stats $stats, the server $got" \
		test "$stats" -gt 0 -a "$pushed" = "$stats" -a "$got" = "$stats"
	pulled=$(total "$TMP/s2" unisum_pulled_from_server_bytes_total "server=\"$s\"")
	sent=$(total "$TMP/s2" unisum_server_sent_bytes_total "role=\"server\",rank=\"$s\"")
	expect "server $s: the workers pulled $pulled bytes from it, it sent $sent" \
		test "$pulled" -gt 0 -a "$pulled" = "$sent"
done
touch "$TMP/hold/go"
wait "$JOB_PID"
expect "the job ends with every sum right" [ "$(cat "$TMP/job.rc")" = 0 ]
[ "$(cat "$TMP/job.rc")" = 0 ] || sed 's/^/    /' "$TMP/job.out"
expect "the job file is gone with the job" [ ! -e "/tmp/unisum-$(id -u)/$JOB.metrics" ]

# A stall, named while it lasts: worker 1 of 3 stops itself (SIGSTOP)
# after 20 rounds; the others wait for it past UNISUM_STALL_WARN_MS, and
# the metrics name the wait on the servers and on the workers, until the
# scheduler finds worker 1 silent and fails the job.
PORT=$(free_port)
UNISUM_STALL_WARN_MS=300 UNISUM_HEARTBEAT_MS=200 UNISUM_TIMEOUT_MS=5000 timeout 120 \
	"$UNISUM" launch --metrics="$PORT" -w 3 -s 2 --local-size 1 -- "$CHECK" stop 1 20 \
	>"$TMP/stall.out" 2>&1 &
STALL_PID=$!
seen=""
for _ in $(seq 60); do
	curl -s --max-time 5 "http://127.0.0.1:$PORT/metrics" >"$TMP/s3" 2>/dev/null
	seen=$(grep '^unisum_stall_seconds{' "$TMP/s3" || true)
	contains "$seen" 'role="server".*waits for worker\(s\) 1' &&
		contains "$seen" 'role="worker".*waits for tensor' && break
	sleep 0.2
done
expect "a server's stall names the worker it waits for" contains "$seen" \
	'role="server".*what="server [01]: tensor .die. .*waits for worker\(s\) 1"'
expect "a waiting worker's stall names its tensor" contains "$seen" \
	'role="worker",rank="[02]".*what="worker [02] waits for tensor .die. round 20"'
[ -n "$seen" ] || sed 's/^/    /' "$TMP/s3"
expect "stalls are counted" [ "$(total "$TMP/s3" unisum_stalls_total role=\"server\")" -gt 0 ]
wait "$STALL_PID"
expect "the job then fails, naming worker 1" grep -q "worker 1" "$TMP/stall.out"
finish
