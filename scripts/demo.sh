#!/usr/bin/env bash
# Tessera's main job: make a small file-backed array (4 data + 2 parity on
# 6 member files of 128 MiB), serve it over NBD, prove it with real clients
# (copy an image in and out, fail two members, read it again), then keep
# serving until Ctrl-C, printing how to connect.
#
#   scripts/demo.sh [DIR]      (default: ./demo-array, kept afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh
cargo build --release --quiet
tessera=$PWD/target/release/tessera
dir=$(realpath -m "${1:-demo-array}")
socket="$dir.sock"
if [ ! -e "$dir/members" ]; then
  "$tessera" create --data 4 --parity 2 --dir "$dir" --devices 6 --device-size 128M --compress lz4
fi
"$tessera" serve "$dir" --socket "$socket" &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S "$socket" ] && [ -S "$dir/control.sock" ] && break; sleep 0.05; done
uri="nbd+unix:///tessera?socket=$socket"

nbdinfo "$uri" | grep -E "export-size|block_size|can_multi_conn"
work=$(mktemp -d)
head -c $((48 << 20)) /dev/urandom > "$work/image"
echo "copy a 48 MiB random image in and out with nbdcopy"
nbdcopy "$work/image" "$uri"
echo "fail members 0 and 5 (M = 2): reads reconstruct from the other four"
"$tessera" fail "$dir" --device 0
"$tessera" fail "$dir" --device 5
nbdcopy "$uri" "$work/back"
cmp <(head -c $((48 << 20)) "$work/back") "$work/image"
echo "the image came back byte for byte, degraded"
rm -rf "$work"
"$tessera" status "$dir"
echo
echo "serving $dir at $uri (members 0 and 5 marked failed; recreate the array to start fresh)"
echo "try, from another terminal:"
echo "  nbdinfo '$uri'"
echo "  qemu-img convert -n -O raw disk.img '$uri'"
echo "  fio --name=t --ioengine=nbd --uri='$uri' --rw=randrw --bs=4k --size=64M --verify=crc32c"
echo "  $tessera status $dir"
echo "Ctrl-C stops the server cleanly."
wait $server
