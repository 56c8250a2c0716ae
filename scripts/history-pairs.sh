#!/usr/bin/env bash
# A first look at drafting from earlier answers (issue 57, item 4): a
# device-only device daemon over make run's device index with
# --history-tokens TOKENS (0: off) and no KV cache, asked three pairs of
# related questions greedily; prints each answer's tokens, forward passes
# and beginning. Needs make build qwen index-qwen.
#
#   scripts/history-pairs.sh TOKENS
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${1:?usage: $0 TOKENS}
idx=$(mktemp -d)
log=$(mktemp)
cp -r data/index-qwen/device/. "$idx/"
bin/dragon device --cloud "" --listen 127.0.0.1:7391 --http 127.0.0.1:8391 --index "$idx" \
  --history-tokens "$tokens" --kv-cache-mb 0 --threads 1 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$idx" "$log"' EXIT
for _ in $(seq 1 240); do grep -qs 'msg=serving' "$log" && break; sleep 0.5; done
ask() {
  bin/dragon ask --device 127.0.0.1:7391 --temperature 0 --max-tokens 64 --json "$1" 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); s=d; print("tokens", s["tokens"], "passes", s["forward_passes_device"], repr(d["text"][:60]))'
}
while IFS='|' read -r first second; do
  echo "first:  $(ask "$first")"
  echo "second: $(ask "$second")"
done <<'PAIRS'
What did my mail say about California electricity prices?|What did my mail say about California electricity prices?
Who took the lead over the computer Deep Fritz, according to my mail?|According to my mail, who was leading the chess match against Deep Fritz?
What did the mail about the Razor revoke feature say?|And what else did that mail about Razor say?
PAIRS
