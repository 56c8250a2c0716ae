#!/usr/bin/env bash
# make run: start a cloud and a device daemon on this machine (each pinned
# to its own core when there are two, one thread each), ask one question
# through the device, print the answer and its summary, and stop both
# daemons whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
question=${1:?usage: scripts/demo.sh QUESTION}
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

# Each daemon's model, index and profile: make run's defaults unless set
# (make run-qwen sets them for the Qwen pair).
cloud_args=() device_args=()
[ -n "${CLOUD_MODEL:-}" ] && cloud_args+=(--model "$CLOUD_MODEL")
[ -n "${CLOUD_INDEX:-}" ] && cloud_args+=(--index "$CLOUD_INDEX")
[ -n "${CLOUD_PROFILE:-}" ] && cloud_args+=(--profile "$CLOUD_PROFILE")
[ -n "${DEVICE_MODEL:-}" ] && device_args+=(--model "$DEVICE_MODEL")
[ -n "${DEVICE_INDEX:-}" ] && device_args+=(--index "$DEVICE_INDEX")
[ -n "${DEVICE_PROFILE:-}" ] && device_args+=(--profile "$DEVICE_PROFILE")

$(pin 0) bin/dragon cloud "${cloud_args[@]}" >"$logs/cloud.log" 2>&1 &
pids+=($!)
wait_serving cloud "$logs/cloud.log"
$(pin 1) bin/dragon device "${device_args[@]}" >"$logs/device.log" 2>&1 &
pids+=($!)
wait_serving device "$logs/device.log"

echo "Q: $question"
bin/dragon ask --device 127.0.0.1:7071 "$question"
