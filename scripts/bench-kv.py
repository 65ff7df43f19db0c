"""KV spaces against their peers, in one run on one disk (scripts/bench-kv.sh
runs it against a served array):

- insert: VPIC-like particles (id u64, x y z ux uy uz energy f32) through
  pyarrow.flight DoPut, acknowledged durable, against the array's own
  sequential write (nbdcopy of as many bytes to a volume, flushed), and
  against RocksDB (rocksdict) on a file system on the same disk: WAL on
  with default options, and with its bulk-load settings (no WAL);
- insert stalls: the longest one batch's send was held up, and the
  longest the stream went without an acknowledgment, beside the disk
  alone making as many bytes durable in as many pieces;
- the deferred sort and index, records per second;
- a point get (p50, p99 of 1,000 random keys) and a selective query
  (energy above the 99.9th percentile: 0.1% of records; the first time,
  and asked again, from the server's batch cache) against a full scan of
  the same records in Parquet (pyarrow) and against RocksDB with a
  secondary index kept as a second column family.

Every figure is printed as a Markdown table row.
"""

import argparse
import json
import mmap
import os
import statistics
import subprocess
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq

import kv_records

parser = argparse.ArgumentParser()
parser.add_argument("--address", required=True)
parser.add_argument("--nbd", required=True, help="NBD URI of a volume to write as the array's own baseline")
parser.add_argument("--records", type=int, default=10_000_000)
parser.add_argument("--work", required=True, help="a directory on the array's disk")
parser.add_argument("--rocksdb", action="store_true", help="measure RocksDB too (rocksdict)")
parser.add_argument("--tls-ca", help="PEM CA certificate to trust (a grpc+tls:// address)")
parser.add_argument("--server-pid", type=int, help="the server's process: its CPU time during the insert is shown")
parser.add_argument("--written", action="store_true",
                    help="the array's members were written with zeros first: the disk peer's file is too")
args = parser.parse_args()
n = args.records
tls = {"tls_root_certs": open(args.tls_ca, "rb").read()} if args.tls_ca else {}
client = fl.FlightClient(args.address, **tls)
rows = []


def row(what, figure, note=""):
    rows.append((what, figure, note))
    print(f"| {what} | {figure} | {note} |", flush=True)


def server_cpu():
    """The server's CPU seconds so far (user and system), or None."""
    if not args.server_pid:
        return None
    fields = open(f"/proc/{args.server_pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def act(kind, body):
    results = list(client.do_action(fl.Action(kind, json.dumps(body).encode())))
    return json.loads(results[0].body.to_pybytes())


# The records, made before anything is timed.
rng, columns, table, schema = kv_records.vpic(n)
data_bytes = table.nbytes
threshold = float(np.quantile(columns["energy"], 0.999))
selected = int((columns["energy"] > np.float32(threshold)).sum())
mb = data_bytes / 1e6
print(f"{n} records, {mb:.0f} MB; energy > {threshold:.4f} selects {selected}", flush=True)

# The array's own sequential write of as many bytes.
source = "/dev/shm/tessera-bench-kv"
with open(source, "wb") as f:
    f.write(os.urandom(1 << 20) * (data_bytes >> 20))
start = time.perf_counter()
subprocess.run(["nbdcopy", "--flush", source, args.nbd], check=True)
seq = time.perf_counter() - start
os.unlink(source)
seq_rate = (data_bytes >> 20 << 20) / seq / 1e6
row("array: sequential write (nbdcopy, flushed)", f"{seq_rate:.0f} MB/s", f"{(data_bytes >> 20)} MiB in {seq:.2f} s")

# KV insert: the records as one DoPut stream (as a simulation's writer
# streams its timestep), acknowledged durable; then, into another space,
# 1 M records (36 MB) a DoPut, each waited for: the latency a writer sees.
act("create", {"name": "bench", "schema": schema})
cpu_before = server_cpu()
start = time.perf_counter()
acked, sends = kv_records.put(client, "bench", table)
insert = time.perf_counter() - start
cpu_after = server_cpu()
insert_rate = mb / insert
row("KV insert (pyarrow.flight, one DoPut stream, durable)", f"{insert_rate:.0f} MB/s, {n / insert / 1e6:.2f} M records/s",
    f"{insert_rate / seq_rate:.2f}x the array's sequential write")
if cpu_before is not None:
    cpu = cpu_after - cpu_before
    row("KV insert, the server's CPU time in that stream", f"{cpu:.2f} s",
        f"{cpu / data_bytes * 1e9:.2f} ns a byte, {cpu / insert:.2f} cores")
# An insert stall: the longest one batch's send was held up.
slowest = max(range(len(sends)), key=sends.__getitem__)
row("KV insert, the longest send of one batch (an insert stall) in that stream", f"{sends[slowest] * 1e3:.0f} ms",
    f"{len(sends)} batches of up to 65,536 records, median {statistics.median(sends) * 1e3:.1f} ms;"
    f" the longest was batch {slowest + 1}, the next longest {sorted(sends)[-2] * 1e3:.0f} ms")
# The longest the client went on sending with no insert made durable
# (from the stream's start to its first acknowledgment, then between
# acknowledgments; an insert is 16-32 MiB).
gaps = [b - a for a, b in zip([start] + acked, acked)]
longest = max(range(len(gaps)), key=gaps.__getitem__)
row("KV insert, the longest wait for an acknowledgment in that stream", f"{gaps[longest] * 1e3:.0f} ms",
    f"{len(acked)} acknowledgments, median gap {statistics.median(gaps) * 1e3:.0f} ms;"
    f" the longest before acknowledgment {longest + 1}")
# The disk alone, as the peer for that wait: as many bytes as the
# stream's inserts put on the members (their data and parity, 6/4 of it
# at 4+2), written to one file on the same file system with O_DIRECT (as
# the array writes its members), in as many pieces as there were
# acknowledgments, each one write made durable (fdatasync) before the
# next. Its longest piece is how long the disk by itself held up a
# writer that waited for each piece. With --written, the file is written
# with zeros and synced first, as the members were, so that no piece's
# sync allocates blocks.
pieces = max(len(acked), 1)
piece = mmap.mmap(-1, max(1, (data_bytes * 6 // 4 // pieces) >> 20) << 20)
piece.write(os.urandom(1 << 20) * (len(piece) >> 20))
peer = os.path.join(args.work, "disk-peer")
try:
    fd = os.open(peer, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    direct = "O_DIRECT"
except OSError:
    fd = os.open(peer, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    direct = "through the page cache (no O_DIRECT here)"
times = []
try:
    if args.written:
        zeros = mmap.mmap(-1, len(piece))
        for _ in range(pieces):
            os.write(fd, zeros)
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        direct += ", over blocks written before"
    for _ in range(pieces):
        t = time.perf_counter()
        os.write(fd, piece)
        os.fdatasync(fd)
        times.append(time.perf_counter() - t)
finally:
    os.close(fd)
    os.unlink(peer)
row("disk alone: the longest write + fdatasync of one insert's member bytes", f"{max(times) * 1e3:.0f} ms",
    f"{pieces} pieces of {len(piece) >> 20} MiB, {direct}, median {statistics.median(times) * 1e3:.0f} ms;"
    f" the KV wait above is {gaps[longest] / max(times):.2f}x this")
act("create", {"name": "puts", "schema": schema})
# The first DoPut of a client process is the slowest: pyarrow's first
# serialization of 1 M records took 161 ms where the third took 19 (its
# buffers' memory faulted in), while the server's first insert took what
# the others did. So the rest are shown apart from it.
per_put = []
start = time.perf_counter()
for at in range(0, n, 1_000_000):
    t0 = time.perf_counter()
    kv_records.put(client, "puts", table.slice(at, 1_000_000))
    per_put.append(time.perf_counter() - t0)
puts = time.perf_counter() - start
act("drop", {"name": "puts"})
row("KV insert, a DoPut of 1 M records each, waited for", f"{mb / puts:.0f} MB/s",
    f"a DoPut's latency p50 {statistics.median(per_put) * 1e3:.0f} ms, max {max(per_put) * 1e3:.0f} ms"
    f" (the first {per_put[0] * 1e3:.0f} ms, the rest at most {max(per_put[1:] or [0]) * 1e3:.0f})")

# The deferred work.
start = time.perf_counter()
act("finalize", {"name": "bench"})
while act("status", {"name": "bench"})["space"]["phase"] != "ready":
    time.sleep(0.05)
deferred = time.perf_counter() - start
cores = os.cpu_count()
row("KV sort by key and index on energy", f"{n / deferred / 1e6:.2f} M records/s",
    f"{deferred:.1f} s on {cores} cores ({n / deferred / cores / 1e6:.2f} M records/s a core)")


def kv_query(q):
    ticket = fl.Ticket(json.dumps({"space": "bench", "query": q}).encode())
    return client.do_get(ticket).read_all()


keys = rng.integers(0, n, 1000)
lat = []
for k in keys:
    t0 = time.perf_counter()
    got = kv_query({"get": int(k)})
    lat.append(time.perf_counter() - t0)
    assert got.num_rows == 1
lat.sort()
row("KV point get", f"p50 {lat[500] * 1e3:.2f} ms, p99 {lat[990] * 1e3:.2f} ms")
# The first time, its batches come from the members; asked again, from
# the server's batch cache (serve --kv-cache), as RocksDB's come from its
# block cache and the page cache.
times = []
for _ in range(6):
    t0 = time.perf_counter()
    got = kv_query({"where": {"field": "energy", "gt": threshold}})
    times.append(time.perf_counter() - t0)
    assert got.num_rows == selected, (got.num_rows, selected)
kv_first, kv_select = times[0], statistics.median(times[1:])
row("KV selective query (0.1%, energy index), asked again", f"{kv_select * 1e3:.1f} ms",
    f"{selected} records; the first time {kv_first * 1e3:.1f} ms")

# Parquet: the same records, a full scan and a filter.
path = os.path.join(args.work, "particles.parquet")
pq.write_table(table, path)
times = []
for _ in range(3):
    t0 = time.perf_counter()
    scanned = pq.read_table(path)
    got = scanned.filter(pa.compute.greater(scanned["energy"], pa.scalar(threshold, pa.float32())))
    times.append(time.perf_counter() - t0)
    assert got.num_rows == selected
scan = statistics.median(times)
row("Parquet full scan and filter (pyarrow)", f"{scan * 1e3:.0f} ms", f"KV query {scan / kv_first:.0f}x faster the first time, {scan / kv_select:.0f}x asked again")
os.unlink(path)

if args.rocksdb:
    from rocksdict import Options, Rdict, WriteBatch, WriteOptions

    records = np.empty(n, dtype=[(c, "<u8" if c == "id" else "<f4") for c in columns])
    for c in columns:
        records[c] = columns[c]
    raw, size = records.tobytes(), records.itemsize
    values = [raw[i * size:(i + 1) * size] for i in range(n)]
    id_keys = [int(i).to_bytes(8, "big") for i in columns["id"]]
    ebits = columns["energy"].view(np.uint32)
    # Energies are positive: their bits sort as the values do.
    energy_keys = [int(e).to_bytes(4, "big") + k for e, k in zip(ebits, id_keys)]

    def rocks(name, bulk, index):
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        if bulk:
            options.prepare_for_bulk_load()
        db = Rdict(os.path.join(args.work, name), options)
        cf = db.create_column_family("energy", Options(raw_mode=True)) if index else None
        handle = db.get_column_family_handle("energy") if index else None
        write = WriteOptions()
        write.disable_wal = bulk
        t0, held = time.perf_counter(), []
        for at in range(0, n, 100_000):
            batch = WriteBatch(raw_mode=True)
            for i in range(at, min(at + 100_000, n)):
                batch.put(id_keys[i], values[i])
                if index:
                    batch.put(energy_keys[i], values[i], handle)
            t = time.perf_counter()
            db.write(batch, write)
            held.append(time.perf_counter() - t)
        db.flush()
        return db, cf, time.perf_counter() - t0, held

    # `held`: how long each `write` of a 100,000-record batch took; a
    # stall, when compaction falls behind, shows in the longest, against
    # the median that the insert rate alone makes.
    def batch_writes(held):
        return (f"the longest write of a batch {max(held) * 1e3:.0f} ms"
                f" (median {statistics.median(held) * 1e3:.0f})")

    db, _, took, held = rocks("rocks-default", bulk=False, index=False)
    row("RocksDB insert, WAL on, default options", f"{mb / took:.0f} MB/s",
        f"KV insert {insert_rate / (mb / took):.1f}x (RocksDB not synced per batch);"
        f" {batch_writes(held)}")
    db.close()
    db, _, took, held = rocks("rocks-bulk", bulk=True, index=False)
    row("RocksDB insert, bulk-load settings (no WAL)", f"{mb / took:.0f} MB/s",
        f"KV insert {insert_rate / (mb / took):.1f}x; {batch_writes(held)}")
    db.close()
    db, cf, took, held = rocks("rocks-index", bulk=False, index=True)
    row("RocksDB insert with an energy index (2nd column family)", f"{mb / took:.0f} MB/s",
        batch_writes(held))
    lat = []
    for k in keys:
        t0 = time.perf_counter()
        assert db.get(int(columns["id"][k]).to_bytes(8, "big")) is not None
        lat.append(time.perf_counter() - t0)
    lat.sort()
    row("RocksDB point get", f"p50 {lat[500] * 1e3:.3f} ms, p99 {lat[990] * 1e3:.3f} ms")
    low = int(np.float32(threshold).view(np.uint32)).to_bytes(4, "big") + b"\xff" * 8
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        found = [v for _, v in cf.items(from_key=low)]
        times.append(time.perf_counter() - t0)
        assert len(found) == selected, (len(found), selected)
    rocks_first, rocks_select = times[0], statistics.median(times[1:])
    row("RocksDB selective query (energy column family), asked again", f"{rocks_select * 1e3:.1f} ms",
        f"KV query {rocks_select / kv_select:.2f}x faster; the first time {rocks_first * 1e3:.1f} ms"
        f" (KV {rocks_first / kv_first:.2f}x)")
    db.close()

act("drop", {"name": "bench"})
