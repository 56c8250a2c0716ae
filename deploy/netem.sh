#!/usr/bin/env bash
# Shapes what a real network interface sends with tc: netem for delay,
# jitter and loss (and its built-in rate), as DRAGON's testbed emulated the
# device–cloud link. Where the kernel lacks netem, a rate alone falls back
# to tbf; delay, jitter and loss then need `dragon netsim` (userspace).
set -euo pipefail

prog=${0##*/}

usage() {
  cat <<EOF
usage: $prog add|change|clear IFACE [--delay 150ms] [--jitter 30ms] [--loss 1%] [--rate 10mbit] [--dist normal]
       $prog probe

Shapes the egress of IFACE (what it sends; run it at both ends of a link,
or use deploy/testbed.sh, to shape both directions). Needs root and tc.

  add      put a netem qdisc at the root of IFACE (fails if one is there)
  change   change it; netem resets what is not given, so give every value
  clear    remove the root qdisc if this script put it there (netem or tbf);
           any other root qdisc is left alone
  probe    say whether this kernel has the netem qdisc (exit 0: yes,
           1: no, 2: cannot tell without trying)

  --delay D    one-way delay added to every packet: 150ms, 2s, 500us
  --jitter J   delay variation (needs --delay): 30ms
  --dist K     jitter distribution: normal (default; like netsim's --jitter),
               pareto, paretonormal or uniform
  --loss P     random loss: 1%, 0.1%
  --rate R     bandwidth: 10mbit, 512kbit, 1gbit, 125kbps (tc units: bit
               rates, or bps for bytes/s)

Examples:
  sudo $prog add eth0 --delay 150ms --jitter 30ms --rate 10mbit
  sudo $prog change eth0 --delay 300ms --jitter 30ms --rate 10mbit
  sudo $prog clear eth0

Kernels without the netem qdisc (CONFIG_NET_SCH_NETEM, module sch_netem)
cannot add delay, jitter or loss; use dragon's userspace link emulator:
  bin/dragon netsim --listen 127.0.0.1:7170 --upstream CLOUD:7070 --latency 150ms --jitter 30ms
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

netsim_hint() {
  cat >&2 <<EOF
$prog: this kernel has no netem qdisc ($1), so delay, jitter and loss
cannot be emulated with tc here. Use dragon's userspace link emulator between
the device and the cloud instead:
  bin/dragon netsim --listen 127.0.0.1:7170 --upstream CLOUD:7070 --latency 150ms --jitter 30ms
  bin/dragon device --cloud 127.0.0.1:7170
(a --rate alone still works here: tbf needs no netem)
EOF
}

# kernel_config prints the running kernel's build configuration, if exposed.
kernel_config() {
  if [[ -r /proc/config.gz ]]; then
    gzip -dc /proc/config.gz 2>/dev/null || true
  elif [[ -r /boot/config-$(uname -r) ]]; then
    cat "/boot/config-$(uname -r)"
  fi
}

# netem_state prints "yes", "no REASON" or "unknown": tc would load the
# module on demand, so a loaded module, the kernel config or modprobe's dry
# run decides; a kernel that says nothing is tried for real.
netem_state() {
  if [[ -d /sys/module/sch_netem ]]; then
    echo yes
    return
  fi
  local cfg
  cfg=$(kernel_config | grep -E '^(# )?CONFIG_NET_SCH_NETEM[= ]' || true)
  case $cfg in
    CONFIG_NET_SCH_NETEM=y)
      echo yes
      return
      ;;
    "# CONFIG_NET_SCH_NETEM is not set")
      echo "no CONFIG_NET_SCH_NETEM is not set"
      return
      ;;
  esac
  # A module (=m) or an unknown config: ask modprobe, which only knows
  # when this kernel's module tree is installed.
  if command -v modprobe >/dev/null && [[ -d /lib/modules/$(uname -r) ]]; then
    if modprobe -n -q sch_netem; then
      echo yes
    else
      echo "no modprobe -n sch_netem fails"
    fi
    return
  fi
  echo unknown
}

# tc_netem runs tc; when the kernel turns out to lack netem it returns 3
# (tc's own error is terse), and dies on any other failure.
tc_netem() {
  local err
  if err=$(tc "$@" 2>&1); then
    return 0
  fi
  if grep -qiE 'qdisc kind is unknown|unknown qdisc|no such file' <<<"$err"; then
    netem_err=$err
    return 3
  fi
  die "tc $*: $err"
}

# rate_burst prints a tbf burst in bytes for rate $1: 10 ms of traffic, at
# least two full-size frames, so tbf reaches the rate at any kernel HZ.
rate_burst() {
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

root_kind() {
  tc qdisc show dev "$1" root 2>/dev/null | awk 'NR == 1 { print $2 }'
}

# --- arguments -------------------------------------------------------------

case ${1:-} in
  -h | --help | help)
    usage
    exit 0
    ;;
  add | change | clear | probe) cmd=$1 ;;
  "") usage_error "missing command (add, change, clear or probe)" ;;
  *) usage_error "unknown command '$1' (add, change, clear or probe)" ;;
esac
shift

iface=
delay='' jitter='' loss='' rate='' dist=normal
while (($#)); do
  case $1 in
    -h | --help)
      usage
      exit 0
      ;;
    --delay | --jitter | --loss | --rate | --dist)
      (($# >= 2)) || usage_error "$1 needs a value"
      v=$2
      case $1 in
        --delay | --jitter)
          [[ $v =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || usage_error "$1 $v: want a duration such as 150ms, 2s or 500us"
          ;;
        --loss)
          [[ $v =~ ^[0-9]+(\.[0-9]+)?%$ ]] || usage_error "--loss $v: want a percentage such as 1% or 0.1%"
          ;;
        --rate)
          [[ $v =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] || usage_error "--rate $v: want a tc rate such as 10mbit, 512kbit or 125kbps"
          ;;
        --dist)
          [[ $v =~ ^(normal|pareto|paretonormal|uniform)$ ]] || usage_error "--dist $v: want normal, pareto, paretonormal or uniform"
          ;;
      esac
      printf -v "${1#--}" %s "$v" # delay, jitter, loss, rate or dist
      shift 2
      ;;
    --delay=* | --jitter=* | --loss=* | --rate=* | --dist=*)
      set -- "${1%%=*}" "${1#*=}" "${@:2}"
      ;;
    -*) usage_error "unknown option '$1'" ;;
    *)
      [[ -z $iface ]] || usage_error "one interface only (got '$iface' and '$1')"
      iface=$1
      shift
      ;;
  esac
done

if [[ $cmd == probe ]]; then
  state=$(netem_state)
  case $state in
    yes) echo "netem: available" ;;
    no*)
      echo "netem: missing (${state#no }); use dragon netsim for delay, jitter and loss"
      exit 1
      ;;
    *)
      echo "netem: cannot tell (no kernel config or module tree); tc will try"
      exit 2
      ;;
  esac
  exit 0
fi

[[ -n $iface ]] || usage_error "$cmd needs an interface"
if [[ $cmd == clear && -n $delay$jitter$loss$rate ]]; then
  usage_error "clear takes no shaping options"
fi
if [[ $cmd != clear && -z $delay$jitter$loss$rate ]]; then
  usage_error "$cmd needs at least one of --delay, --jitter, --loss, --rate"
fi
[[ -z $jitter || -n $delay ]] || usage_error "--jitter needs --delay"

command -v tc >/dev/null || die "tc not found: install iproute2 (apt-get install iproute2)"
command -v ip >/dev/null || die "ip not found: install iproute2 (apt-get install iproute2)"
ip link show dev "$iface" >/dev/null 2>&1 || die "unknown interface '$iface' (ip -brief link lists them)"
((EUID == 0)) || die "must run as root to change qdiscs (sudo $prog $cmd $iface ...)"

# --- commands --------------------------------------------------------------

if [[ $cmd == clear ]]; then
  kind=$(root_kind "$iface")
  case $kind in
    netem | tbf)
      tc qdisc del dev "$iface" root
      echo "$iface: $kind removed"
      ;;
    *) echo "$iface: root qdisc is ${kind:-none}, not one this script adds; left as is" ;;
  esac
  exit 0
fi

# tbf_rate shapes the rate alone with tbf, which needs no netem.
tbf_rate() {
  local burst verb=add
  burst=$(rate_burst "$rate") || die "--rate $rate: cannot read this rate"
  if [[ $cmd == change ]]; then
    [[ $(root_kind "$iface") == tbf ]] || die "$iface has no tbf root qdisc to change (use add)"
    verb=change
  fi
  tc qdisc "$verb" dev "$iface" root tbf rate "$rate" burst "$burst" latency 50ms ||
    die "tc qdisc $verb dev $iface root tbf failed"
  echo "$iface: tbf rate $rate (netem missing: no delay, jitter or loss)"
}

# no_netem handles a kernel without netem: a rate alone still works.
no_netem() {
  if [[ -n $delay$jitter$loss ]]; then
    netsim_hint "$1"
    exit 1
  fi
  tbf_rate
  exit 0
}

state=$(netem_state)
[[ $state != no* ]] || no_netem "${state#no }"

args=(netem)
if [[ -n $delay ]]; then
  args+=(delay "$delay")
  if [[ -n $jitter ]]; then
    args+=("$jitter")
    [[ $dist == uniform ]] || args+=(distribution "$dist")
  fi
fi
[[ -z $loss ]] || args+=(loss "$loss")
[[ -z $rate ]] || args+=(rate "$rate")

netem_err=
if [[ $cmd == add ]]; then
  [[ $(root_kind "$iface") != netem ]] || die "$iface already has a netem qdisc (use change, or clear first)"
  tc_netem qdisc add dev "$iface" root "${args[@]}" || no_netem "tc qdisc add ... netem: $netem_err"
else
  [[ $(root_kind "$iface") == netem ]] || die "$iface has no netem root qdisc to change (use add)"
  tc_netem qdisc change dev "$iface" root "${args[@]}" || no_netem "tc qdisc change ... netem: $netem_err"
fi
tc qdisc show dev "$iface" root
