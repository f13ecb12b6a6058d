#!/usr/bin/env bash
# `just cluster`: the example three-node cluster of config/cluster/ on this machine, in the
# foreground. Writes the cluster certificates first if they are missing; Ctrl-C or SIGTERM
# stops all three together (so does any one of them ending).
#
#   MQTT  127.0.0.1:1883, 1884, 1885     HTTP API  127.0.0.1:6061, 6062, 6063
#   then: target/release/starling cluster status --config config/cluster/node1.toml
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --bin starling
bin=target/release/starling
dir=config/cluster
if [[ ! -f $dir/certs/ca.pem || ! -f $dir/certs/node-3.key ]]; then
    "$bin" cert cluster "$dir/certs" --nodes 1,2,3 --name 127.0.0.1
fi

pids=()
stop() {
    trap - INT TERM
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
for i in 1 2 3; do
    "$bin" --config "$dir/node$i.toml" &
    pids+=($!)
done
# Until one ends (or a signal comes): then the others go too.
wait -n "${pids[@]}" || true
stop
