#!/usr/bin/env bash
# A load tool from the package index, GuideLLM, against `specdec serve` (the bundled tiny pair on
# local Ray, its OpenAI-compatible HTTP API): a short sweep of constant request rates on
# /v1/chat/completions (GuideLLM's default route) and one rate on /v1/completions, offline
# (synthetic prompts, the tokenizer read from the bundled model's own files). Starts the
# server, runs the sweep, stops the server; prints GuideLLM's console report, writes its JSON
# reports under OUT_DIR (default: a new temporary directory) and prints them as one table
# (benchmarks/results/load_tool_sweep.md). Exits non-zero if any request failed.
#
# Usage: bash benchmarks/load_tool_sweep.sh [OUT_DIR]        (about 2 minutes after the server is up)
#   GUIDELLM=/path/to/guidellm   the tool (default: guidellm on PATH). Install it beside this
#                                project's pins without changing them, e.g.
#                                python -m venv --system-site-packages /tmp/gl && /tmp/gl/bin/pip install guidellm
#   RATES="1 2 4"                requests/s of the chat sweep; REQUESTS_PER_RATE=20 (each one sent and
#                                answered: a rate ends when its last request has finished)
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${1:-$(mktemp -d)}"
guidellm="${GUIDELLM:-guidellm}"
rates="${RATES:-1 2 4}"
count="${REQUESTS_PER_RATE:-20}"
model="bundled:target"
tokenizer="$PWD/specdec/bundled/target"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
read -r port http_port < <(python3 -c 'from specdec.wiring.ports import free_port; print(free_port(), free_port())')
url="http://127.0.0.1:$http_port"
mkdir -p "$out_dir"
# one worker process for the tool (the server's CPUs are the ones measured), its log beside its reports
export GUIDELLM__MAX_WORKER_PROCESSES=1 GUIDELLM__LOGGING__LOG_FILE="$out_dir/guidellm.log"

log="$(mktemp)"
python3 -c 'import sys; from specdec_cli.serve_cli import main; sys.exit(main())' \
  serve --port "$port" --http-port "$http_port" >"$log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  grep -q "specdec serving on" "$log" && break
  kill -0 "$server" 2>/dev/null || { cat "$log" >&2; echo "specdec serve exited early" >&2; exit 1; }
  sleep 0.5
done
grep "specdec serving on" "$log" || { echo "server not ready in time" >&2; exit 1; }

# run ROUTE NAME RATE...: one GuideLLM run of constant rates, REQUESTS_PER_RATE each, 64-token
# synthetic prompts and 32 generated tokens (GuideLLM then sends ignore_eos: true)
run() {
  local route="$1" name="$2"; shift 2
  "$guidellm" run --disable-progress \
    --backend "kind=openai_http,target=$url,model=$model,request_format=$route" \
    --tokenizer "kind=huggingface_auto,model=$tokenizer" \
    --data "kind=synthetic_text,prompt_tokens=64,output_tokens=32" \
    --profile "{\"kind\": \"constant\", \"rate\": [$(echo "$*" | tr ' ' ',')]}" \
    --constraint "kind=max_requests,count=$count" \
    --seed "kind=static,value=42" \
    --output "kind=console" --output "kind=json,path=$out_dir/$name.json"
}
run /v1/chat/completions chat $rates
run /v1/completions completions 2

# the reports in one table (medians over each rate's requests); fails if any request failed
python3 - "$out_dir" <<'EOF'
import json, pathlib, sys
failed, rows = 0, ["| route | rate (req/s) | requests | errored | requests/s | output tokens/s | TTFT p50 / p95 (ms) "
                   "| ITL p50 / p95 (ms) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for bench in json.loads(path.read_text())["benchmarks"]:
        m, totals = bench["metrics"], bench["metrics"]["request_totals"]
        failed += totals["errored"] + totals["incomplete"]
        ok = lambda name: m[name]["successful"]
        pct = lambda name: "{p50:.1f} / {p95:.1f}".format(**ok(name)["percentiles"])
        rows.append(f"| /v1/{path.stem.replace('chat', 'chat/completions')} | {bench['config']['strategy']['rate']:g} "
                    f"| {totals['successful']} | {totals['errored'] + totals['incomplete']} "
                    f"| {ok('requests_per_second')['mean']:.2f} | {ok('output_tokens_per_second')['mean']:.1f} "
                    f"| {pct('time_to_first_token_ms')} | {pct('inter_token_latency_ms')} |")
print("\n".join(rows))
print(f"requests errored or incomplete: {failed}")
sys.exit(1 if failed else 0)
EOF
