"""KV spaces through pyarrow.flight, as a scientist's script would use them.

  kv_flight.py ADDRESS main          inserts, bad input, finalize, queries
                                     checked against numpy; prints JSON
                                     of the counts the CLI must agree with
  kv_flight.py ADDRESS fill          inserts until the array is full
  kv_flight.py ADDRESS kill-insert   inserts 20,000-record batches, one
                                     DoPut each, printing "acked I" after
                                     each acknowledgement, until killed
  kv_flight.py ADDRESS kill-check N  every record is in whole batches,
                                     batches 0..N at least
  kv_flight.py ADDRESS largest      one batch as large as a gRPC message
                                     may be (256 MiB), inserted and read
                                     back; one larger refused
  kv_flight.py grpc+tls://ADDRESS tls CA TOKEN_FILE
                                     over TLS, trusting CA, with the
                                     token: a space made, filled and
                                     read back; refused without the
                                     token, and to a plain client

Run by crates/cli/tests/kv.rs; every check is an assert.
"""

import json
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

address, mode = sys.argv[1], sys.argv[2]
if mode == "tls":
    CA = open(sys.argv[3], "rb").read()
    TOKEN = open(sys.argv[4]).readline().strip()
    client = fl.FlightClient(address, tls_root_certs=CA)
    OPTIONS = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
else:
    client = fl.FlightClient(address)
    OPTIONS = None

SCHEMA = {
    "key": "id",
    "fields": [{"name": n, "type": t} for n, t in [
        ("id", "u64"), ("x", "f32"), ("y", "f32"), ("z", "f32"),
        ("ux", "f32"), ("uy", "f32"), ("uz", "f32"), ("energy", "f32")]],
    "indexes": ["energy"],
}


def act(kind, body):
    results = list(client.do_action(fl.Action(kind, json.dumps(body).encode()), OPTIONS))
    assert len(results) == 1, results
    return json.loads(results[0].body.to_pybytes())


def status(name):
    return act("status", {"name": name})["space"]


def particles(n, first_id, seed):
    rng = np.random.default_rng(seed)
    columns = {"id": np.arange(first_id, first_id + n, dtype=np.uint64)}
    for f in ["x", "y", "z", "ux", "uy", "uz"]:
        columns[f] = rng.random(n, dtype=np.float32)
    columns["energy"] = rng.exponential(1.0, n).astype(np.float32)
    return pa.table(columns)


def put(name, table, chunk=50_000, options=None):
    writer, reader = client.do_put(fl.FlightDescriptor.for_path(name), table.schema, options or OPTIONS)
    writer.write_table(table, max_chunksize=chunk)
    writer.done_writing()
    acks = []
    while True:
        buf = reader.read()
        if buf is None:
            break
        acks.append(json.loads(buf.to_pybytes()))
    writer.close()
    return acks


def refused(what, text, call):
    """`call` fails, its message says `text`."""
    try:
        call()
    except pa.ArrowException as e:
        assert text in str(e), f"{what}: {e}"
        return
    raise AssertionError(f"{what}: no error")


def query(name, q):
    command = json.dumps({"space": name, "query": q}).encode()
    info = client.get_flight_info(fl.FlightDescriptor.for_command(command), OPTIONS)
    table = client.do_get(info.endpoints[0].ticket, OPTIONS).read_all()
    return table, json.loads(info.app_metadata)["indexed"]


def check_queries(name, model, indexed):
    ids, energy = model.column("id").to_numpy(), model.column("energy").to_numpy()
    threshold = float(np.quantile(energy, 0.999))
    cases = [
        ({"get": int(ids[7])}, ids == ids[7]),
        ({"get": 10**15}, np.zeros(len(ids), bool)),
        ({"keys": {"ge": 1000, "lt": 1100}}, (ids >= 1000) & (ids < 1100)),
        ({"where": {"field": "energy", "gt": threshold}}, energy > np.float32(threshold)),
        ({"where": {"field": "energy", "ge": 0.5, "le": 0.50001}}, (energy >= 0.5) & (energy <= np.float32(0.50001))),
    ]
    counts = {}
    for q, mask in cases:
        table, said = query(name, q)
        assert said == indexed, (q, said, indexed)
        got = sorted(table.column("id").to_pylist())
        want = sorted(ids[mask].tolist())
        assert got == want, (q, len(got), len(want))
        if table.num_rows:
            # Whole records, as inserted.
            row = table.slice(0, 1).to_pylist()[0]
            at = int(np.nonzero(ids == row["id"])[0][0])
            assert row == model.slice(at, 1).to_pylist()[0], row
        counts[json.dumps(q)] = len(want)
    return counts, threshold


if mode == "main":
    act("create", {"name": "p", "schema": SCHEMA})
    refused("a schema whose key is no field", "not one of the fields",
            lambda: act("create", {"name": "q", "schema": {**SCHEMA, "key": "nope"}}))
    refused("a space twice", "exists already", lambda: act("create", {"name": "p", "schema": SCHEMA}))
    refused("an unknown action", "no action", lambda: act("rename", {}))
    refused("a malformed action body", "create", lambda: list(client.do_action(fl.Action("create", b"{oops"))))
    model = pa.concat_tables([particles(60_000, 60_000 * i, i) for i in range(5)])
    put("p", model.slice(0, 150_000))
    refused("DoPut to an unknown space", "no space named", lambda: put("nope", model.slice(0, 10)))
    wrong = model.slice(0, 10).set_column(7, "energy", pa.array(np.ones(10)))
    refused("a batch of the wrong type", "does not match", lambda: put("p", wrong))
    with_nulls = model.slice(0, 10).set_column(1, "x", pa.array([None] * 10, pa.float32()))
    refused("a batch with nulls", "nulls", lambda: put("p", with_nulls))
    lz4 = fl.FlightCallOptions(write_options=pa.ipc.IpcWriteOptions(compression="lz4"))
    refused("a batch with a compressed body", "send batches uncompressed",
            lambda: put("p", model.slice(0, 10), options=lz4))
    refused("a malformed ticket", "a ticket", lambda: client.do_get(fl.Ticket(b"not json")).read_all())
    refused("a query of an unknown field", "no field",
            lambda: query("p", {"where": {"field": "mass", "gt": 1}}))
    refused("a descriptor path of two names", "descriptor path",
            lambda: client.get_schema(fl.FlightDescriptor.for_path("p", "q")))
    assert status("p")["inserted"] == 150_000, status("p")
    put("p", model.slice(150_000))
    assert status("p")["inserted"] == 300_000
    counts, _ = check_queries("p", model, indexed=False)
    assert act("finalize", {"name": "p"}) == {"finalized": True}
    refused("an insert after finalize", "finalized", lambda: put("p", model.slice(0, 10)))
    for _ in range(600):
        s = status("p")
        if s["phase"] == "ready":
            break
        time.sleep(0.1)
    assert s["phase"] == "ready" and s["sorted"] == 300_000 and s["indexes_built"] == ["energy"], s
    counts, threshold = check_queries("p", model, indexed=True)
    # The schema as the space keeps it, and the space in ListFlights.
    schema = client.get_schema(fl.FlightDescriptor.for_path("p")).schema
    assert schema.names == [f["name"] for f in SCHEMA["fields"]], schema
    flights = list(client.list_flights())
    assert [f.descriptor.path for f in flights] == [[b"p"]] and flights[0].total_records == 300_000
    # A DoPut of more than one insert (72 MB, inserts of 16-32 MiB):
    # acknowledged in order, every record in once.
    act("create", {"name": "big", "schema": SCHEMA})
    big = particles(2_000_000, 0, 9)
    acks = put("big", big, chunk=100_000)
    assert len(acks) >= 2 and acks[-1] == {"rows": 2_000_000}, acks
    rows = [a["rows"] for a in acks]
    assert all(a < b for a, b in zip(rows, rows[1:])), acks
    table, _ = query("big", {"keys": {"ge": 1_999_990}})
    assert sorted(table.column("id").to_pylist()) == list(range(1_999_990, 2_000_000))
    assert status("big")["inserted"] == 2_000_000
    act("drop", {"name": "big"})
    # The same records as one batch (72 MB): more than a frame holds, so
    # decoded and cut, where smaller batches are stored as they came.
    act("create", {"name": "one", "schema": SCHEMA})
    assert put("one", big, chunk=len(big)) == [{"rows": 2_000_000}]
    table, _ = query("one", {"keys": {"ge": 1_999_990}})
    assert sorted(table.column("id").to_pylist()) == list(range(1_999_990, 2_000_000))
    assert status("one")["inserted"] == 2_000_000
    act("drop", {"name": "one"})
    # Acknowledgments come while the stream goes on: after more than two
    # inserts' worth of batches (43 MB, inserts of 16-32 MiB), one is
    # read before the client is done writing. A server that sent them
    # only at the end left this read waiting until the call's timeout
    # (seen).
    act("create", {"name": "stream", "schema": SCHEMA})
    parts = [particles(100_000, 100_000 * i, 20 + i) for i in range(14)]
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("stream"), parts[0].schema,
                                   fl.FlightCallOptions(timeout=60))
    for part in parts[:12]:
        writer.write_table(part)
    first = json.loads(reader.read().to_pybytes())
    assert 0 < first["rows"] < 1_200_000, first
    for part in parts[12:]:
        writer.write_table(part)
    writer.done_writing()
    acks = [first]
    while (buf := reader.read()) is not None:
        acks.append(json.loads(buf.to_pybytes()))
    writer.close()
    assert acks[-1] == {"rows": 1_400_000}, acks
    assert status("stream")["inserted"] == 1_400_000
    act("drop", {"name": "stream"})
    print(json.dumps({"threshold": threshold, "counts": counts}))

elif mode == "fill":
    act("create", {"name": "fill", "schema": SCHEMA})
    acked = 0
    for i in range(1000):
        batch = particles(200_000, 200_000 * i, i)
        try:
            acks = put("fill", batch, chunk=200_000)
        except pa.ArrowException as e:
            assert "the array is full" in str(e), e
            break
        acked = acks[-1]["rows"] + acked
    else:
        raise AssertionError("the array never filled")
    assert status("fill")["inserted"] == acked, (status("fill"), acked)
    act("drop", {"name": "fill"})
    refused("a dropped space", "no space named", lambda: status("fill"))
    print(json.dumps({"acked": acked}))

elif mode == "kill-insert":
    act("create", {"name": "k", "schema": SCHEMA})
    for i in range(100_000):
        put("k", particles(20_000, 20_000 * i, i))
        print(f"acked {i}", flush=True)

elif mode == "kill-check":
    acked = int(sys.argv[3])
    ids = np.sort(query("k", "all")[0].column("id").to_numpy())
    batches = len(ids) // 20_000
    assert len(ids) % 20_000 == 0, f"{len(ids)} records: part of a batch"
    assert batches >= acked, f"{batches} batches back, {acked} acknowledged"
    assert np.array_equal(ids, np.arange(batches * 20_000, dtype=np.uint64)), "records lost or twice"
    print(json.dumps({"batches": batches}))

elif mode == "largest":
    # The server takes messages of up to 256 MiB. Each record is 36
    # bytes in 8 columns; the message's header and padding are under 4
    # KiB. Framed (cut into frames of at most 64 MiB, each with a header
    # and the schema), such a batch is more than 256 MiB on the volume.
    MESSAGE_MAX = 256 << 20
    act("create", {"name": "largest", "schema": SCHEMA})
    n = (MESSAGE_MAX - 4096) // 36
    largest = particles(n, 0, 5)
    assert put("largest", largest, chunk=n) == [{"rows": n}]
    assert status("largest")["inserted"] == n
    table, _ = query("largest", {"keys": {"ge": n - 10}})
    assert sorted(table.column("id").to_pylist()) == list(range(n - 10, n))
    table, _ = query("largest", {"get": 12345})
    assert table.to_pylist() == largest.slice(12345, 1).to_pylist()
    # A batch past what one message may carry: refused by gRPC, nothing
    # inserted.
    over = particles(n + 1000, n, 6)
    refused("a batch larger than a message", f"at most {MESSAGE_MAX} bytes a message", lambda: put("largest", over, chunk=n + 1000))
    assert status("largest")["inserted"] == n
    act("drop", {"name": "largest"})
    print(json.dumps({"rows": n}))

elif mode == "tls":
    act("create", {"name": "secure", "schema": SCHEMA})
    model = particles(5_000, 0, 11)
    assert put("secure", model)[-1]["rows"] == 5_000
    table, _ = query("secure", "all")
    got = table.sort_by("id")
    for name in model.column_names:
        assert np.array_equal(got.column(name).to_numpy(), model.column(name).to_numpy()), name
    # Over TLS without the token: refused.
    bare = fl.FlightClient(address, tls_root_certs=CA)
    refused("no token over TLS", "wants a token", lambda: list(bare.do_action(fl.Action("status", b"{}"))))
    # A plain client, token and all: no answer from a server that speaks TLS.
    plain = fl.FlightClient(address.replace("grpc+tls://", "grpc://"))
    refused("a plain client", "", lambda: list(plain.do_action(
        fl.Action("status", b"{}"),
        fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())], timeout=20))))
    print(json.dumps({"rows": table.num_rows}))
