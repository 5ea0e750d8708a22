#!/usr/bin/env bash
# The embedded default end to end: local Ray, the bundled tiny pair as a draft worker and a
# target group, the Serve router behind its gRPC and HTTP proxies; then a streamed generation
# over gRPC, one OpenAI-style HTTP call, the live stats, and a clean shutdown.
# Usage: bash scripts/demo.sh [GRPC_PORT] [HTTP_PORT]
set -euo pipefail
port="${1:-50051}"
http_port="${2:-8000}"
log="$(mktemp)"
specdec serve --port "$port" --http-port "$http_port" >"$log" 2>/dev/null &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  grep -q "specdec serving on" "$log" && break
  kill -0 "$server" 2>/dev/null || { echo "specdec serve exited early" >&2; exit 1; }
  sleep 0.5
done
grep "specdec serving on" "$log" || { echo "server not ready in time" >&2; exit 1; }
echo "--- specdec client generate --stream (greedy, draft speculation)"
specdec client generate --server "127.0.0.1:$port" --prompt "def fibonacci(n):" --max-new-tokens 64 --stream
echo "--- the same request, whole, as JSON (text, token_ids, stats)"
specdec client generate --server "127.0.0.1:$port" --prompt "def fibonacci(n):" --max-new-tokens 64 --json
echo "--- the OpenAI-compatible HTTP API: POST /v1/completions with curl"
curl -sS "http://127.0.0.1:$http_port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "bundled:target", "prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0}'
echo
echo "--- specdec status"
specdec status --server "127.0.0.1:$port"
