"""DoPut streams into fresh spaces, each batch's send timed (scripts/bench-kv-stall.sh).

Prints, a stream a line: the insert rate, the longest send of one batch
(how long the server held the sender up: an insert stall), the median
send, and the gaps between acknowledgments (from the stream's start).
"""

import json
import statistics
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

address, records, streams, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
client = fl.FlightClient(address)
rng = np.random.default_rng(1)
columns = {"id": rng.permutation(records).astype(np.uint64)}
for name in ["x", "y", "z", "ux", "uy", "uz"]:
    columns[name] = rng.random(records, dtype=np.float32)
columns["energy"] = rng.exponential(1.0, records).astype(np.float32)
table = pa.table(columns)
schema = {"key": "id", "fields": [{"name": c, "type": "u64" if c == "id" else "f32"} for c in columns],
          "indexes": ["energy"]}
for stream in range(streams):
    space = f"stall{stream}"
    list(client.do_action(fl.Action("create", json.dumps({"name": space, "schema": schema}).encode())))
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(space), table.schema)
    acked = []

    def acks():
        while reader.read() is not None:
            acked.append(time.perf_counter())

    thread = threading.Thread(target=acks)
    thread.start()
    sends = []
    start = time.perf_counter()
    for batch in table.to_batches(max_chunksize=1 << 16):
        t = time.perf_counter()
        writer.write_batch(batch)
        sends.append(time.perf_counter() - t)
    writer.done_writing()
    thread.join()
    writer.close()
    took = time.perf_counter() - start
    gaps = [round((b - a) * 1e3) for a, b in zip([start] + acked, acked)]
    print(f"{label} stream {stream}: {table.nbytes / took / 1e6:.0f} MB/s, longest send {max(sends) * 1e3:.0f} ms, "
          f"median send {statistics.median(sends) * 1e3:.1f} ms, {len(acked)} acknowledgments, "
          f"gaps (ms) median {statistics.median(gaps):.0f}, longest {max(gaps)}: {gaps}", flush=True)
