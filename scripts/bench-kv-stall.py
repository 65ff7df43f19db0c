"""DoPut streams into fresh spaces, each batch's send timed (scripts/bench-kv-stall.sh).

Prints, a stream a line: the insert rate, the longest send of one batch
(how long the server held the sender up: an insert stall), the median
send, and the gaps between acknowledgments (from the stream's start).
"""

import json
import statistics
import sys
import time

import pyarrow.flight as fl

import kv_records

address, records, streams, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
client = fl.FlightClient(address)
_, _, table, schema = kv_records.vpic(records)
for stream in range(streams):
    space = f"stall{stream}"
    list(client.do_action(fl.Action("create", json.dumps({"name": space, "schema": schema}).encode())))
    start = time.perf_counter()
    acked, sends = kv_records.put(client, space, table)
    took = time.perf_counter() - start
    gaps = [round((b - a) * 1e3) for a, b in zip([start] + acked, acked)]
    print(f"{label} stream {stream}: {table.nbytes / took / 1e6:.0f} MB/s, longest send {max(sends) * 1e3:.0f} ms, "
          f"median send {statistics.median(sends) * 1e3:.1f} ms, {len(acked)} acknowledgments, "
          f"gaps (ms) median {statistics.median(gaps):.0f}, longest {max(gaps)}: {gaps}", flush=True)
