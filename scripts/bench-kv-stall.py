"""DoPut streams into fresh spaces, each batch's send timed (scripts/bench-kv-stall.sh).

Prints, a stream a line: the insert rate, the longest send of one batch
(how long the server held the sender up: an insert stall), the median
send, and the gaps between acknowledgments (from the stream's start).
Given the server's pid as well, runs the streams at once (a client
each) and prints their rate in all and the server's peak RSS.
"""

import json
import statistics
import sys
import threading
import time

import pyarrow.flight as fl

import kv_records

address, records, streams, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# With a server's pid after them: the streams go at once, each from its
# own client (threads of this process), and the server's peak RSS is
# printed with them.
server = int(sys.argv[5]) if len(sys.argv) > 5 else None
client = fl.FlightClient(address)
_, _, table, schema = kv_records.vpic(records)


def one(stream, client):
    space = f"stall{stream}"
    start = time.perf_counter()
    acked, sends = kv_records.put(client, space, table)
    took = time.perf_counter() - start
    gaps = [round((b - a) * 1e3) for a, b in zip([start] + acked, acked)]
    return (f"{label} stream {stream}: {table.nbytes / took / 1e6:.0f} MB/s, longest send {max(sends) * 1e3:.0f} ms, "
            f"median send {statistics.median(sends) * 1e3:.1f} ms, {len(acked)} acknowledgments, "
            f"gaps (ms) median {statistics.median(gaps):.0f}, longest {max(gaps)}: {gaps}")


for stream in range(streams):
    list(client.do_action(fl.Action("create", json.dumps({"name": f"stall{stream}", "schema": schema}).encode())))
if server is None:
    for stream in range(streams):
        print(one(stream, client), flush=True)
else:
    lines = [None] * streams

    def run(stream):
        lines[stream] = one(stream, fl.FlightClient(address))

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(s,)) for s in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - start
    for line in lines:
        print(line)
    with open(f"/proc/{server}/status") as f:
        peak = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
    print(f"{label}: {streams} streams at once, {streams * table.nbytes / took / 1e6:.0f} MB/s in all; "
          f"the server's peak RSS {peak >> 10} MiB", flush=True)
