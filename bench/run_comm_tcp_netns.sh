#!/usr/bin/env bash
# The TCP backend's all-reduce between ranks on separate "hosts": one Linux network namespace
# per rank, each joined to a bridge by a veth pair whose two directions are rate-limited (tc
# tbf), so every rank has a link of its own of RATE each way, as pods on separate nodes behind
# their own NICs. On 127.0.0.1 all ranks share one CPU-bound loopback, which hides how many
# bytes cross each rank's link (comm/tcp.cpp: the star through rank 0 moved (P-1)·n there, the
# mesh 2(P-1)/P·n). Needs root (CAP_NET_ADMIN) and iproute2's ip and tc.
#   usage: bench/run_comm_tcp_netns.sh P RATE BENCH_BINARY...   (e.g. 4 1gbit build/comm/bench_comm_tcp)
# Each binary runs in turn on the same namespaces (bench_comm_tcp's --rank mode), so that two
# builds (before and after a change) compare on the same links in one run.
set -euo pipefail
p=${1:?world size}
rate=${2:?rate, e.g. 1gbit}
shift 2
[ $# -ge 1 ] || { echo "usage: $0 P RATE BENCH_BINARY..." >&2; exit 2; }
br=snapbr$$
cleanup() {
  for r in $(seq 0 $((p - 1))); do ip netns del "snapns$$-$r" 2>/dev/null || true; done
  ip link del "$br" 2>/dev/null || true
}
trap cleanup EXIT
ip link add "$br" type bridge
ip link set "$br" up
for r in $(seq 0 $((p - 1))); do
  ns=snapns$$-$r
  ip netns add "$ns"
  ip link add "sv$$r$r" type veth peer name "sp$$r$r"
  ip link set "sp$$r$r" netns "$ns"
  ip link set "sv$$r$r" master "$br" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "10.77.0.$((r + 1))/24" dev "sp$$r$r"
  ip netns exec "$ns" ip link set "sp$$r$r" up
  # The rank's upload (its side's egress) and download (the bridge side's egress), RATE each.
  ip netns exec "$ns" tc qdisc add dev "sp$$r$r" root tbf rate "$rate" burst 512kb latency 100ms
  tc qdisc add dev "sv$$r$r" root tbf rate "$rate" burst 512kb latency 100ms
done
port=29650
for bin in "$@"; do
  echo "== $bin, $p ranks, $rate per rank each way"
  pids=()
  for r in $(seq 1 $((p - 1))); do
    ip netns exec "snapns$$-$r" "$bin" --rank "$r" --world-size "$p" --leader 10.77.0.1 --port "$port" &
    pids+=($!)
  done
  ip netns exec "snapns$$-0" "$bin" --rank 0 --world-size "$p" --leader 10.77.0.1 --port "$port"
  for pid in "${pids[@]}"; do wait "$pid"; done
  port=$((port + 1))
done
