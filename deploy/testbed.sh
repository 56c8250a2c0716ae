#!/usr/bin/env bash
# A device–cloud testbed on one Linux machine: two network namespaces,
# dragon-dev and dragon-cloud, joined by a veth pair, so the device's peer
# stream crosses a real (virtual) link that tc can shape: tbf for the rate
# and, where the kernel has it, netem for delay, jitter and loss, on both
# ends (each direction). Kernels without netem get the delay from
# `dragon netsim` run inside dragon-dev (run-netsim).
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

NS_DEV=dragon-dev
NS_CLOUD=dragon-cloud
IF_DEV=veth-dev
IF_CLOUD=veth-cloud
DEV_ADDR=${DEV_ADDR:-10.77.0.1}
CLOUD_ADDR=${CLOUD_ADDR:-10.77.0.2}
PREFIX=${PREFIX:-24}
DRAGON=${DRAGON:-$repo/bin/dragon}
# One core each, as make run does (empty: no pinning).
PIN_CLOUD=${PIN_CLOUD-0}
PIN_DEVICE=${PIN_DEVICE-1}

usage() {
  cat <<EOF
usage: $prog COMMAND [ARGS]

  up                 create namespaces $NS_DEV ($DEV_ADDR/$PREFIX on $IF_DEV) and
                     $NS_CLOUD ($CLOUD_ADDR/$PREFIX on $IF_CLOUD), joined by a veth pair
  down               stop every process in the two namespaces and delete them
  status             addresses, qdiscs and processes of the testbed
  shape [--delay 150ms] [--jitter 30ms] [--loss 1%] [--rate 10mbit]
                     shape both directions (each veth end's egress): --delay is
                     one-way, like netsim's --latency; tbf does --rate, netem the
                     rest where the kernel has it; no options: clear the shaping
  run-cloud [FLAGS]  bin/dragon cloud in $NS_CLOUD on $CLOUD_ADDR:7070 (FLAGS are
                     dragon cloud's and override these defaults)
  run-device [FLAGS] bin/dragon device in $NS_DEV, its cloud $CLOUD_ADDR:7070 (or
                     --cloud 127.0.0.1:7170 through run-netsim)
  run-netsim [FLAGS] bin/dragon netsim in $NS_DEV on 127.0.0.1:7170 to the cloud
                     (--latency 150ms --jitter 30ms): delay where netem is missing
  exec dev|cloud CMD run CMD in a namespace, e.g.
                     $prog exec dev bin/dragon ask "question"

Everything but --help needs root (sudo). run-* and exec start from the
repository root ($repo), as the sudo user when there is one, and run in
the foreground: use one terminal each, or '&'. Pass a token with
'sudo DRAGON_TOKEN=... $prog run-cloud' (sudo drops the environment).
Environment: DRAGON (binary, default bin/dragon), DEV_ADDR, CLOUD_ADDR,
PREFIX, PIN_CLOUD and PIN_DEVICE (cores for taskset; empty: none).

Typical run (two terminals, or '&'):
  sudo $prog up
  sudo $prog shape --delay 75ms --jitter 10ms --rate 10mbit
  sudo $prog run-cloud &
  sudo $prog run-device &
  sudo $prog exec dev bin/dragon ask "question"
  sudo $prog down
Without netem (this kernel lacks CONFIG_NET_SCH_NETEM): shape --rate only, and
  sudo $prog run-netsim --latency 75ms --jitter 10ms &
  sudo $prog run-device --cloud 127.0.0.1:7170 &
EOF
}

die() {
  echo "$prog: error: $*" >&2
  exit 1
}

usage_error() {
  echo "$prog: $*" >&2
  echo "run '$prog --help' for usage" >&2
  exit 2
}

need_root() {
  ((EUID == 0)) || die "must run as root: namespaces and qdiscs need it (sudo $prog $cmd ...)"
  command -v ip >/dev/null || die "ip not found: install iproute2"
}

ns_exists() { ip netns list 2>/dev/null | awk '{ print $1 }' | grep -qx "$1"; }

need_up() {
  if ! ns_exists "$NS_DEV" || ! ns_exists "$NS_CLOUD"; then
    die "the testbed is not up (sudo $prog up)"
  fi
}

# as_user drops root for the daemons when run through sudo: they need no
# privilege, and files they write stay the user's.
as_user=()
if [[ -n ${SUDO_UID:-} && ${SUDO_UID:-0} != 0 ]] && command -v setpriv >/dev/null; then
  as_user=(setpriv "--reuid=$SUDO_UID" "--regid=$SUDO_GID" --init-groups --)
fi

# pin prints a taskset prefix for core $1 when there is more than one core.
pin() {
  if [[ -n $1 ]] && command -v taskset >/dev/null && (($(nproc) > 1)); then
    echo "taskset -c $1"
  fi
}

has_flag() { # has_flag PATTERN ARGS...: some arg matches the glob
  local p=$1 a
  shift
  for a in "$@"; do
    # shellcheck disable=SC2053 # the pattern is meant as a glob
    [[ $a == $p ]] && return 0
  done
  return 1
}

wants_help() { has_flag '-h' "$@" || has_flag '--help' "$@"; }

need_binary() {
  [[ -x $DRAGON ]] || die "$DRAGON not found or not executable (make build, or set DRAGON=PATH)"
}

teardown() {
  local ns pids
  for ns in "$NS_DEV" "$NS_CLOUD"; do
    ns_exists "$ns" || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [[ -n $pids ]]; then
      # shellcheck disable=SC2086 # one pid per word
      kill -TERM $pids 2>/dev/null || true
      # The daemons drain for up to --drain-timeout; give them 15 s.
      for _ in $(seq 30); do
        [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
        sleep 0.5
      done
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      # shellcheck disable=SC2086
      [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns"
  done
}

cmd_up() {
  need_root
  command -v tc >/dev/null || die "tc not found: install iproute2"
  if ns_exists "$NS_DEV" || ns_exists "$NS_CLOUD"; then
    die "the testbed is already up ($prog down first)"
  fi
  try() { "$@" || {
    echo "$prog: failed: $*; removing what was created" >&2
    teardown
    exit 1
  }; }
  try ip netns add "$NS_DEV"
  try ip netns add "$NS_CLOUD"
  try ip link add "$IF_DEV" netns "$NS_DEV" type veth peer name "$IF_CLOUD" netns "$NS_CLOUD"
  try ip -n "$NS_DEV" addr add "$DEV_ADDR/$PREFIX" dev "$IF_DEV"
  try ip -n "$NS_CLOUD" addr add "$CLOUD_ADDR/$PREFIX" dev "$IF_CLOUD"
  try ip -n "$NS_DEV" link set lo up
  try ip -n "$NS_CLOUD" link set lo up
  try ip -n "$NS_DEV" link set "$IF_DEV" up
  try ip -n "$NS_CLOUD" link set "$IF_CLOUD" up
  echo "up: $NS_DEV $DEV_ADDR/$PREFIX <-> $NS_CLOUD $CLOUD_ADDR/$PREFIX"
  "$here/netem.sh" probe || true
}

cmd_down() {
  need_root
  if ! ns_exists "$NS_DEV" && ! ns_exists "$NS_CLOUD"; then
    echo "the testbed is not up"
    return
  fi
  teardown
  echo "down"
}

cmd_status() {
  need_root
  local ns ifc
  for ns in "$NS_DEV" "$NS_CLOUD"; do
    if ! ns_exists "$ns"; then
      echo "$ns: absent"
      continue
    fi
    ifc=$IF_DEV
    [[ $ns == "$NS_CLOUD" ]] && ifc=$IF_CLOUD
    echo "$ns:"
    ip -n "$ns" -brief addr show dev "$ifc" | sed 's/^/  /'
    tc -n "$ns" qdisc show dev "$ifc" | sed 's/^/  qdisc: /'
    echo "  pids: $(ip netns pids "$ns" | tr '\n' ' ')"
  done
}

netsim_hint() {
  cat >&2 <<EOF
$prog: this kernel has no netem qdisc ($1): delay, jitter and loss cannot be
put on the veth link. Shape the rate only (shape --rate 10mbit) and add the
delay in userspace with dragon netsim inside $NS_DEV:
  sudo $prog run-netsim --latency 150ms --jitter 30ms &
  sudo $prog run-device --cloud 127.0.0.1:7170
EOF
}

# burst is a tbf bucket of 10 ms of traffic at rate $1, at least two
# full-size frames, so tbf reaches the rate whatever the kernel's HZ.
burst() {
  awk -v r="$1" 'BEGIN {
    if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
    n = substr(r, 1, RLENGTH) + 0; u = tolower(substr(r, RLENGTH + 1))
    m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9; m["tbps"] = 8e12
    if (!(u in m)) exit 1
    b = n * m[u] / 8 / 100
    if (b < 3028) b = 3028
    printf "%d\n", b
  }'
}

cmd_shape() {
  local delay='' jitter='' loss='' rate='' v
  while (($#)); do
    case $1 in
      -h | --help)
        usage
        exit 0
        ;;
      --delay | --jitter | --loss | --rate)
        (($# >= 2)) || usage_error "$1 needs a value"
        v=$2
        case $1 in
          --delay | --jitter) [[ $v =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || usage_error "$1 $v: want a duration such as 150ms" ;;
          --loss) [[ $v =~ ^[0-9]+(\.[0-9]+)?%$ ]] || usage_error "--loss $v: want a percentage such as 1%" ;;
          --rate) [[ $v =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] || usage_error "--rate $v: want a tc rate such as 10mbit" ;;
        esac
        printf -v "${1#--}" %s "$v"
        shift 2
        ;;
      --delay=* | --jitter=* | --loss=* | --rate=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
      *) usage_error "shape: unknown argument '$1'" ;;
    esac
  done
  [[ -z $jitter || -n $delay ]] || usage_error "--jitter needs --delay"
  need_root
  command -v tc >/dev/null || die "tc not found: install iproute2"
  need_up

  local netem=()
  if [[ -n $delay ]]; then
    netem+=(delay "$delay")
    [[ -z $jitter ]] || netem+=("$jitter" distribution normal)
  fi
  [[ -z $loss ]] || netem+=(loss "$loss")
  local tbf=()
  if [[ -n $rate ]]; then
    # 100 ms of queue before tbf drops: a loaded link, not a bufferbloated one.
    tbf=(tbf rate "$rate" burst "$(burst "$rate")" latency 100ms)
  fi

  if ((${#netem[@]})); then
    local state
    state=$("$here/netem.sh" probe 2>&1) || {
      # probe exits 1 when netem is known to be missing; 2 when it cannot
      # tell, and then tc below tries.
      if [[ $state == *missing* ]]; then
        netsim_hint "$(sed -n 's/.*missing (\(.*\)).*/\1/p' <<<"$state")"
        exit 1
      fi
    }
  fi

  local ns ifc err
  for ns in "$NS_DEV" "$NS_CLOUD"; do
    ifc=$IF_DEV
    [[ $ns == "$NS_CLOUD" ]] && ifc=$IF_CLOUD
    tc -n "$ns" qdisc del dev "$ifc" root 2>/dev/null || true
    if ((${#netem[@]})); then
      if ! err=$(tc -n "$ns" qdisc add dev "$ifc" root handle 1: netem "${netem[@]}" 2>&1); then
        if grep -qiE 'qdisc kind is unknown|unknown qdisc|no such file' <<<"$err"; then
          netsim_hint "tc: $err"
          exit 1
        fi
        die "tc -n $ns qdisc add dev $ifc root netem: $err"
      fi
      # netem's child shapes the rate after the delay: tbf under netem 1:1.
      if ((${#tbf[@]})); then
        tc -n "$ns" qdisc add dev "$ifc" parent 1:1 handle 10: "${tbf[@]}" ||
          die "tc -n $ns: tbf under netem failed"
      fi
    elif ((${#tbf[@]})); then
      tc -n "$ns" qdisc add dev "$ifc" root handle 1: "${tbf[@]}" ||
        die "tc -n $ns qdisc add dev $ifc root tbf failed (is sch_tbf in this kernel?)"
    fi
  done
  if [[ -z $delay$jitter$loss$rate ]]; then
    echo "shaping cleared"
  else
    echo "shaped each direction:${delay:+ delay $delay}${jitter:+ jitter $jitter}${loss:+ loss $loss}${rate:+ rate $rate}"
  fi
}

# run NS CORE CMD...: CMD in namespace NS from the repository root.
run_in() {
  local ns=$1 core=$2
  shift 2
  cd "$repo"
  # shellcheck disable=SC2046 # pin's output is meant to split into words
  exec ip netns exec "$ns" "${as_user[@]}" $(pin "$core") "$@"
}

cmd_run_cloud() {
  need_binary
  if wants_help "$@"; then exec "$DRAGON" cloud --help; fi
  need_root
  need_up
  local args=(cloud --listen "$CLOUD_ADDR:7070")
  # The link is not loopback: plaintext needs --insecure, unless TLS is set.
  has_flag '--tls-*' "$@" || has_flag '--insecure*' "$@" || args+=(--insecure)
  run_in "$NS_CLOUD" "$PIN_CLOUD" "$DRAGON" "${args[@]}" "$@"
}

cmd_run_device() {
  need_binary
  if wants_help "$@"; then exec "$DRAGON" device --help; fi
  need_root
  need_up
  local args=(device --cloud "$CLOUD_ADDR:7070")
  has_flag '--cloud-tls-*' "$@" || has_flag '--cloud-insecure*' "$@" || args+=(--cloud-insecure)
  run_in "$NS_DEV" "$PIN_DEVICE" "$DRAGON" "${args[@]}" "$@"
}

cmd_run_netsim() {
  need_binary
  if wants_help "$@"; then exec "$DRAGON" netsim --help; fi
  need_root
  need_up
  run_in "$NS_DEV" "" "$DRAGON" netsim --listen 127.0.0.1:7170 --upstream "$CLOUD_ADDR:7070" "$@"
}

cmd_exec() {
  local ns
  case ${1:-} in
    dev | device) ns=$NS_DEV ;;
    cloud) ns=$NS_CLOUD ;;
    *) usage_error "exec: want dev or cloud, then a command" ;;
  esac
  shift
  (($#)) || usage_error "exec: missing command"
  need_root
  need_up
  run_in "$ns" "" "$@"
}

cmd=${1:-}
case $cmd in
  -h | --help | help)
    usage
    exit 0
    ;;
  "") usage_error "missing command" ;;
esac
shift
case $cmd in
  up | down | status)
    if wants_help "$@"; then
      usage
      exit 0
    fi
    (($# == 0)) || usage_error "$cmd takes no arguments"
    ;;
esac
case $cmd in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  status) cmd_status "$@" ;;
  shape) cmd_shape "$@" ;;
  run-cloud) cmd_run_cloud "$@" ;;
  run-device) cmd_run_device "$@" ;;
  run-netsim) cmd_run_netsim "$@" ;;
  exec) cmd_exec "$@" ;;
  *) usage_error "unknown command '$cmd'" ;;
esac
