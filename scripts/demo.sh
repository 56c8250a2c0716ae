#!/usr/bin/env bash
# make run: start a cloud and a device daemon on this machine (each pinned
# to its own core when there are two, one thread each), ask questions
# through the device, print each answer with its sources and summary, and
# stop both daemons whatever happens.
#
#   scripts/demo.sh [QUESTION...]
#
# Without questions it asks three over the demo corpora: one the mailbox
# answers, one the public corpus answers, and one that needs both.
# The daemons run with their own defaults (make run's: the Qwen pair, the
# re-ranker) unless DEVICE_MODEL, CLOUD_MODEL, DEVICE_INDEX, CLOUD_INDEX,
# DEVICE_PROFILE, CLOUD_PROFILE or RERANK_MODEL (empty: none) say
# otherwise (make run-tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
questions=("$@")
if [ ${#questions[@]} -eq 0 ]; then
  questions=(
    "According to my mail, who took the lead over the computer Deep Fritz?"
    "In the State of the Union, whom did President Bush direct to develop a national energy policy?"
    "What did my mail say about California electricity prices, and what did the president direct his administration to develop on energy?"
  )
fi
logs=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap cleanup EXIT INT TERM

pin() { # pin CORE: taskset when the machine has that core
  if command -v taskset >/dev/null && [ "$(nproc)" -gt "$1" ]; then echo "taskset -c $1"; fi
}
# wait_serving NAME LOG: until the daemon logs that it serves (or dies).
wait_serving() {
  for _ in $(seq 1 240); do
    grep -qs 'msg=serving' "$2" && return 0
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then echo "the $1 daemon failed:"; cat "$2"; exit 1; fi
    sleep 0.5
  done
  echo "the $1 daemon did not start:"; cat "$2"; exit 1
}

cloud_args=() device_args=()
[ -n "${CLOUD_MODEL:-}" ] && cloud_args+=(--model "$CLOUD_MODEL")
[ -n "${CLOUD_INDEX:-}" ] && cloud_args+=(--index "$CLOUD_INDEX")
[ -n "${CLOUD_PROFILE:-}" ] && cloud_args+=(--profile "$CLOUD_PROFILE")
[ -n "${DEVICE_MODEL:-}" ] && device_args+=(--model "$DEVICE_MODEL")
[ -n "${DEVICE_INDEX:-}" ] && device_args+=(--index "$DEVICE_INDEX")
[ -n "${DEVICE_PROFILE:-}" ] && device_args+=(--profile "$DEVICE_PROFILE")
if [ -n "${RERANK_MODEL+set}" ]; then
  cloud_args+=(--rerank-model "$RERANK_MODEL")
  device_args+=(--rerank-model "$RERANK_MODEL")
fi

$(pin 0) bin/dragon cloud "${cloud_args[@]}" >"$logs/cloud.log" 2>&1 &
pids+=($!)
wait_serving cloud "$logs/cloud.log"
$(pin 1) bin/dragon device "${device_args[@]}" >"$logs/device.log" 2>&1 &
pids+=($!)
wait_serving device "$logs/device.log"

for q in "${questions[@]}"; do
  echo
  echo "Q: $q"
  bin/dragon ask --device 127.0.0.1:7071 "$q"
done

page=http://127.0.0.1:8080/
echo
echo "The device's page: $page (ask, add your documents, see each answer's sources)."
if [ -t 0 ] && [ -t 1 ] && [ -z "${CI:-}" ]; then
  echo "The daemons keep running for it; Ctrl-C stops them."
  wait
else
  echo "(From a terminal, make run keeps the daemons up for the page until Ctrl-C.)"
fi
