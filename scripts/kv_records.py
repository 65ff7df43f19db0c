"""What the KV benchmarks share (scripts/bench-kv.py, bench-kv-stall.py):
VPIC-like records and a DoPut whose every batch's send is timed."""

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl


def vpic(n, seed=1):
    """`n` VPIC-like particles (id u64, x y z ux uy uz energy f32; 36
    bytes each) with unique ids, and the space schema for them (key id,
    an index on energy). Returns the generator (for draws after them),
    the columns, the table and the schema."""
    rng = np.random.default_rng(seed)
    columns = {"id": rng.permutation(n).astype(np.uint64)}
    for f in ["x", "y", "z", "ux", "uy", "uz"]:
        columns[f] = rng.random(n, dtype=np.float32)
    columns["energy"] = rng.exponential(1.0, n).astype(np.float32)
    schema = {"key": "id", "fields": [{"name": c, "type": "u64" if c == "id" else "f32"} for c in columns],
              "indexes": ["energy"]}
    return rng, columns, pa.table(columns), schema


def put(client, name, part):
    """One DoPut of `part` into space `name`: the times its
    acknowledgments came, read on a thread of their own while the batches
    go out, and how long each batch's send took (one held up by the
    server not taking more is an insert stall, as a RocksDB write stall
    holds up `Put`)."""
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(name), part.schema)
    acked = []

    def acks():
        while reader.read() is not None:
            acked.append(time.perf_counter())

    thread = threading.Thread(target=acks)
    thread.start()
    sends = []
    for batch in part.to_batches(max_chunksize=1 << 16):
        t = time.perf_counter()
        writer.write_batch(batch)
        sends.append(time.perf_counter() - t)
    writer.done_writing()
    thread.join()
    writer.close()
    return acked, sends
