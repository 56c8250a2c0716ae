#!/usr/bin/env bash
# Starts and stops Weaviate nodes on loopback, for tests, benchmarks and a
# local scale-out cloud (docs/DESIGN-NOTES.md, Retrieval):
#   cluster.sh start DIR N [BASE]  start N nodes (data under DIR/node-I),
#                                  wait until all are ready, print the URL
#   cluster.sh stop DIR [I]        stop every node of DIR, or node I (SIGTERM,
#                                  then KILL; a node stopped so writes its
#                                  memtables out first)
#   cluster.sh kill DIR I          kill node I at once (SIGKILL), data kept
#   cluster.sh restart DIR I       start node I again on its old data
#   cluster.sh pause DIR I         freeze node I (SIGSTOP): it keeps its
#                                  connections but answers nothing
#   cluster.sh resume DIR I        let a paused node I go on (SIGCONT)
#   cluster.sh urls DIR            print each node's HTTP URL
# Node I listens on BASE+I (HTTP; BASE defaults to 18080), BASE+100+I
# (gRPC), BASE+200+2I and +1 (gossip, data), BASE+300+2I and +1 (Raft),
# BASE+400+I (Go's profiler).
# The binary is $WEAVIATE_BIN, else build/weaviate/weaviate-server (make
# weaviate). With $WEAVIATE_API_KEY set the nodes require that key. With
# $WATCH_PID set each node is stopped once that process is gone (a test
# binary killed by its timeout leaves no node behind).
# BM25 runs on BlockMax WAND over the block format, which a collection
# takes when it is created; releases before 1.38.3 return a wrong top k
# with it (make weaviate builds a later one). WEAVIATE_BM25=exhaustive
# scores every posting instead, on the same files, to compare the two.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${WEAVIATE_BIN:-$root/build/weaviate/weaviate-server}

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

case ${WEAVIATE_BM25:-blockmax} in
  blockmax) blockmax=true ;;
  exhaustive) blockmax=false ;;
  *) echo "error: WEAVIATE_BM25 is blockmax or exhaustive, not ${WEAVIATE_BM25}" >&2; exit 2 ;;
esac

port() { # port DIR I KIND
  local base i=$2
  base=$(cat "$1/base")
  case $3 in
    http) echo $((base + i)) ;;
    grpc) echo $((base + 100 + i)) ;;
    gossip) echo $((base + 200 + 2 * i)) ;;
    data) echo $((base + 201 + 2 * i)) ;;
    raft) echo $((base + 300 + 2 * i)) ;;
    rpc) echo $((base + 301 + 2 * i)) ;;
    pprof) echo $((base + 400 + i)) ;;
  esac
}

start_node() { # start_node DIR I
  local dir=$1 i=$2 n join="" raft_join="" j
  n=$(cat "$dir/nodes")
  for ((j = 0; j < n; j++)); do
    raft_join+="${raft_join:+,}node-$j:$(port "$dir" "$j" raft)"
  done
  [ "$i" -gt 0 ] && join="localhost:$(port "$dir" 0 gossip)"
  # Raft's timeouts are 1 s times this (Weaviate's default 5). A lone node
  # has no peer to wait for, only its own election: with 1 it is ready in
  # about 2 s rather than 7 to 19 (tests start a dozen).
  local multiplier=5
  [ "$n" -eq 1 ] && multiplier=1
  local auth=(AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED=true)
  if [ -n "${WEAVIATE_API_KEY:-}" ]; then
    auth=(AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED=false AUTHENTICATION_APIKEY_ENABLED=true
      "AUTHENTICATION_APIKEY_ALLOWED_KEYS=$WEAVIATE_API_KEY" AUTHENTICATION_APIKEY_USERS=dragon)
  fi
  mkdir -p "$dir/node-$i"
  env -i PATH="$PATH" HOME="${HOME:-/tmp}" "${auth[@]}" \
    PERSISTENCE_DATA_PATH="$dir/node-$i" \
    DEFAULT_VECTORIZER_MODULE=none ENABLE_MODULES= DISABLE_TELEMETRY=true \
    USE_BLOCKMAX_WAND="$blockmax" USE_INVERTED_SEARCHABLE=true \
    QUERY_MAXIMUM_RESULTS=100000 LOG_LEVEL=warning \
    GRPC_PORT="$(port "$dir" "$i" grpc)" GO_PROFILING_PORT="$(port "$dir" "$i" pprof)" \
    CLUSTER_HOSTNAME="node-$i" CLUSTER_IN_LOCALHOST=true CLUSTER_BIND_ADDR=127.0.0.1 CLUSTER_ADVERTISE_ADDR=127.0.0.1 \
    CLUSTER_GOSSIP_BIND_PORT="$(port "$dir" "$i" gossip)" CLUSTER_DATA_BIND_PORT="$(port "$dir" "$i" data)" \
    CLUSTER_JOIN="$join" RAFT_PORT="$(port "$dir" "$i" raft)" RAFT_INTERNAL_RPC_PORT="$(port "$dir" "$i" rpc)" \
    RAFT_JOIN="$raft_join" RAFT_BOOTSTRAP_EXPECT="$n" RAFT_TIMEOUTS_MULTIPLIER="$multiplier" \
    "$bin" --scheme http --host 127.0.0.1 --port "$(port "$dir" "$i" http)" \
    >>"$dir/node-$i.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$dir/node-$i.pid"
  if [ -n "${WATCH_PID:-}" ]; then
    (
      while kill -0 "$WATCH_PID" 2>/dev/null && kill -0 "$pid" 2>/dev/null; do sleep 1; done
      kill -TERM "$pid" 2>/dev/null || exit 0
      sleep 10
      kill -KILL "$pid" 2>/dev/null || true
    ) >/dev/null 2>&1 </dev/null &
  fi
}

wait_port() { # wait_port DIR I KIND SECONDS
  local p deadline
  p=$(port "$1" "$2" "$3")
  deadline=$((SECONDS + $4))
  until (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do
    if [ $SECONDS -ge "$deadline" ] || ! kill -0 "$(cat "$1/node-$2.pid")" 2>/dev/null; then
      echo "error: node $2 is not listening on $3 port $p (log: $1/node-$2.log)" >&2
      return 1
    fi
    sleep 0.1
  done
}

wait_ready() { # wait_ready DIR I SECONDS
  local url deadline
  url="http://127.0.0.1:$(port "$1" "$2" http)/v1/.well-known/ready"
  deadline=$((SECONDS + $3))
  until curl -fsS -o /dev/null "$url" 2>/dev/null; do
    if ! kill -0 "$(cat "$1/node-$2.pid")" 2>/dev/null; then
      echo "error: node $2 exited; its log:" >&2
      tail -20 "$1/node-$2.log" >&2
      return 1
    fi
    if [ $SECONDS -ge "$deadline" ]; then
      echo "error: node $2 not ready after $3 s (log: $1/node-$2.log)" >&2
      return 1
    fi
    sleep 0.2
  done
}

stop_node() { # stop_node DIR I SIGNAL
  local pidf="$1/node-$2.pid" pid
  [ -f "$pidf" ] || return 0
  pid=$(cat "$pidf")
  if kill -0 "$pid" 2>/dev/null; then
    kill -CONT "$pid" 2>/dev/null || true # a paused node handles no TERM
    kill "-$3" "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidf"
}

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then usage; fi
case $cmd in
  start)
    n=${3:-1} base=${4:-18080}
    [ -x "$bin" ] || { echo "error: no Weaviate binary at $bin (make weaviate builds it)" >&2; exit 1; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    echo "$n" >"$dir/nodes"
    echo "$base" >"$dir/base"
    # The others join through node 0's gossip port; a node that finds it
    # closed gives up for good, so it must be listening first.
    start_node "$dir" 0
    wait_port "$dir" 0 gossip 60 || { "$0" stop "$dir"; exit 1; }
    for ((i = 1; i < n; i++)); do start_node "$dir" "$i"; done
    for ((i = 0; i < n; i++)); do wait_ready "$dir" "$i" 120 || { "$0" stop "$dir"; exit 1; }; done
    echo "http://127.0.0.1:$base"
    ;;
  stop)
    [ -f "$dir/nodes" ] || exit 0
    if [ -n "${3:-}" ]; then stop_node "$dir" "$3" TERM; exit 0; fi
    for ((i = 0; i < $(cat "$dir/nodes"); i++)); do stop_node "$dir" "$i" TERM; done
    ;;
  kill) stop_node "$dir" "${3:?node}" KILL ;;
  pause | resume)
    sig=STOP
    [ "$cmd" = resume ] && sig=CONT
    kill "-$sig" "$(cat "$dir/node-${3:?node}.pid")"
    ;;
  restart)
    start_node "$dir" "${3:?node}"
    wait_ready "$dir" "$3" 120
    ;;
  urls)
    for ((i = 0; i < $(cat "$dir/nodes"); i++)); do echo "http://127.0.0.1:$(port "$dir" "$i" http)"; done
    ;;
  *) usage ;;
esac
