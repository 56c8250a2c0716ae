#!/usr/bin/env bash
# Side by side in one run: an older dragon binary (OLD, e.g. one built from
# the last commit before the engine switch), this tree's bin/dragon (NEW) and
# upstream's llama-bench (make llama-upstream) on the same weights, one
# thread and two; then the daemon-level benchmarks for OLD and NEW, each on
# its own default weights. Everything runs pinned to the last core, one
# process at a time; every figure is written as JSON under OUTDIR.
#
#   git worktree add /tmp/old 6a91605 && make -C /tmp/old build
#   scripts/bench-engines.sh /tmp/old/bin/dragon models/OLD.gguf models/NEW.gguf out/
#
# QUICK=1 shortens the daemon-level runs (fewer prompts and questions);
# NOLLAMAFILE=DIR adds a llama-bench built with our kernel settings
# (LLAMA_BENCH=1 scripts/build-llama.sh DIR) as a fourth column.
set -euo pipefail
old=$1 old_model=$2 new_model=$3 out=$4
new=bin/dragon
bench=build/llama-upstream/bin/llama-bench
mkdir -p "$out"
core=$(($(nproc) - 1))
pin=(taskset -c "$core")
two=(taskset -c "0-$core")
n_node=20 n_agg=8 n_load=16
if [ "${QUICK:-0}" = 1 ]; then
  n_node=4 n_agg=4 n_load=8
fi
log() { echo "$(date +%T) $*" >&2; }

models=("$old_model")
[ "$new_model" != "$old_model" ] && models+=("$new_model")
for m in "${models[@]}"; do
  tag=$(basename "$m" .gguf)
  for t in 1 2; do
    run=("${pin[@]}")
    [ "$t" = 2 ] && run=("${two[@]}")
    log "engine $tag, $t thread(s)"
    "${run[@]}" "$old" bench engine --model "$m" --threads "$t" --json >"$out/engine-old-$tag-t$t.json"
    "${run[@]}" "$new" bench engine --model "$m" --threads "$t" --json >"$out/engine-new-$tag-t$t.json"
    if [ -x "$bench" ]; then
      # One pass of k rows at a depth of 256, as bench engine's verify_ms.
      "${run[@]}" "$bench" -m "$m" -t "$t" -d 256 -p 1,2,4,8,16 -n 0 -r 10 -o json >"$out/llama-bench-$tag-t$t.json" 2>/dev/null
    fi
    if [ -n "${NOLLAMAFILE:-}" ]; then
      "${run[@]}" "$NOLLAMAFILE/bin/llama-bench" -m "$m" -t "$t" -fa 0 -d 256 -p 1,2,4,8,16 -n 0 -r 10 -o json >"$out/llama-bench-nollamafile-$tag-t$t.json" 2>/dev/null
    fi
  done
done

for side in old new; do
  bin=$old model=$old_model
  [ "$side" = new ] && bin=$new model=$new_model
  log "node, spec, agg, load: $side"
  "${pin[@]}" "$bin" bench node --model "$model" --threads 1 --n "$n_node" --json >"$out/node-$side.json"
  "${pin[@]}" "$bin" bench spec --model "$model" --threads 1 --held-out --json >"$out/spec-$side.json"
  # bench agg's daemons read data/profile-*.json: fitted by this binary,
  # as make profile fits them (so the last side's stay).
  taskset -c 0 "$bin" profile --model "$model" --threads 1 --out data/profile-cloud.json
  taskset -c "$core" "$bin" profile --model "$model" --threads 1 --out data/profile-device.json
  cp data/profile-cloud.json "$out/profile-cloud-$side.json"
  cp data/profile-device.json "$out/profile-device-$side.json"
  "$bin" bench agg --model "$model" --latencies 0 --questions "$n_agg" >"$out/agg-$side.json"
  "$bin" bench load --model "$model" --questions "$n_load" >"$out/load-$side.json"
done
log "done: $out"
