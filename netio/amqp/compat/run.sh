#!/usr/bin/env bash
# make amqp-compat: real third-party AMQP 0-9-1 clients against a warrend.
#   1. pika (Python; /usr/bin/python3 with python3-pika): compat/pika_compat.py
#   2. amqp091-go's own integration tests, unmodified, from the module
#      version in go.mod (copied out of the module cache), with AMQP_URL
#      pointing at the warrend; the ones that fail must be listed, with why,
#      in compat/amqp091-known-failures.txt.
# Usage: run.sh WARREND_BINARY. Env: GO (go), PYTHON (/usr/bin/python3),
# AMQP_COMPAT_PORT (5697; the native listener and HTTP take the next two).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
warrend="$1"
GO="${GO:-go}"
PYTHON="${PYTHON:-/usr/bin/python3}"
port="${AMQP_COMPAT_PORT:-5697}"
dir="$(mktemp -d)"
"$warrend" --amqp-listen "127.0.0.1:$port" --listen "127.0.0.1:$((port + 1))" --http "127.0.0.1:$((port + 2))" \
	--data "$dir/data" --disk-free-limit -1 --log-level warn 2>"$dir/warrend.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
	kill -0 $pid 2>/dev/null || { echo "warrend exited:"; cat "$dir/warrend.log"; exit 1; }
	sleep 0.1
done
url="amqp://guest:guest@127.0.0.1:$port/"
status=0

echo "== pika against warrend --amqp-listen 127.0.0.1:$port"
if "$PYTHON" -c 'import pika' 2>/dev/null; then
	"$PYTHON" "$here/pika_compat.py" "$url" || status=1
else
	echo "FAIL: $PYTHON has no pika module: apt-get install python3-pika (Debian), or pip install pika"
	status=1
fi

echo "== amqp091-go integration tests against warrend --amqp-listen 127.0.0.1:$port"
root="$(cd "$here/../../.." && pwd)"
moddir="$(cd "$root" && "$GO" mod download -json github.com/rabbitmq/amqp091-go | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
version="$(cd "$root" && "$GO" list -m -f '{{.Version}}' github.com/rabbitmq/amqp091-go)"
if [ -z "$moddir" ] || [ ! -d "$moddir" ]; then
	echo "FAIL: github.com/rabbitmq/amqp091-go is not in the module cache (go mod download)"
	exit 1
fi
cp -r "$moddir" "$dir/amqp091-go" && chmod -R u+w "$dir/amqp091-go"
(cd "$dir/amqp091-go" && GOWORK=off AMQP_URL="$url" "$GO" test -count=1 -tags integration -run Integration -timeout 300s -v . >"$dir/go.out" 2>&1)
pass=$(grep -c '^--- PASS' "$dir/go.out")
fails=$(sed -n 's/^--- FAIL: \([^ ]*\).*/\1/p' "$dir/go.out")
total=$((pass + $(printf '%s' "$fails" | grep -c .)))
echo "amqp091-go $version integration tests: $pass of $total pass"
for t in $fails; do
	why="$(sed -n "s/^$t: //p" "$here/amqp091-known-failures.txt")"
	if [ -n "$why" ]; then
		echo "  known: $t: $why"
	else
		echo "  FAIL (not a known difference): $t"
		sed -n "/^=== RUN   $t\$/,/^--- FAIL: $t /p" "$dir/go.out" | sed 's/^/    /'
		status=1
	fi
done
for t in $(sed -n 's/^\(TestIntegration[A-Za-z0-9_]*\):.*/\1/p' "$here/amqp091-known-failures.txt"); do
	grep -q "^--- PASS: $t " "$dir/go.out" && echo "  now passes (drop it from amqp091-known-failures.txt): $t"
done
if [ "$total" -eq 0 ]; then
	echo "FAIL: no test ran:"
	tail -20 "$dir/go.out"
	status=1
fi
exit $status
