#!/usr/bin/env bash
# What a KV space's sort costs clients: 4 KiB random reads (fio, QD32,
# over NBD) for 6 s without a sort, then for 6 s from the moment 10 M
# records are finalized, with the sort's busy rate RATE (0: it never
# yields), on a 4+2 array of sparse member files under target/.
#
#   scripts/bench-kv-yield.sh RATE        (e.g. 0, 64M)
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:?busy rate, e.g. 0 or 64M}
scripts/install-test-deps.sh
cargo build --release --quiet
tessera=$PWD/target/release/tessera
python=$PWD/target/test-deps/venv/bin/python
source scripts/kv-bench-lib.sh bench-kv-yield
"$tessera" create --data 4 --parity 2 --dir "$work/array" --devices 6 --device-size 4G >/dev/null
kv_serve "$work/array" --kv-sort-busy-rate "$rate"
uri="nbd+unix:///tessera?socket=$work/nbd.sock"
head -c 1G /dev/urandom > "$work/image"
nbdcopy "$work/image" "$uri"
rm "$work/image"
reads() {
  fio --name=reads --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=32 --size=1G \
    --time_based --runtime=6 --output-format=json 2>/dev/null |
    python3 -c "import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):]); print(round(j['jobs'][0]['read']['iops']))"
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; busy rate $rate"
echo "reads without a sort: $(reads) IOPS"
"$python" - "$port" <<'PY'
import json, sys, numpy as np, pyarrow as pa, pyarrow.flight as fl
c = fl.FlightClient(f"grpc://127.0.0.1:{sys.argv[1]}")
fields = ["id", "x", "y", "z", "ux", "uy", "uz", "energy"]
schema = {"key": "id", "fields": [{"name": f, "type": "u64" if f == "id" else "f32"} for f in fields], "indexes": ["energy"]}
list(c.do_action(fl.Action("create", json.dumps({"name": "s", "schema": schema}).encode())))
n, rng = 10_000_000, np.random.default_rng(1)
columns = {"id": rng.permutation(n).astype(np.uint64)}
columns.update({f: rng.random(n, dtype=np.float32) for f in fields[1:]})
table = pa.table(columns)
writer, reader = c.do_put(fl.FlightDescriptor.for_path("s"), table.schema)
writer.write_table(table, max_chunksize=1 << 16)
writer.done_writing()
while reader.read() is not None:
    pass
writer.close()
PY
"$tessera" kv --at "127.0.0.1:$port" finalize s 2>/dev/null
start=$(date +%s.%N)
echo "reads during the sort: $(reads) IOPS"
for _ in $(seq 3000); do "$tessera" kv --at "127.0.0.1:$port" status s | grep -q ready && break; sleep 0.2; done
echo "the sort and index took $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
