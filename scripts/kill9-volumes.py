#!/usr/bin/python3
"""kill -9 while volumes are written, deleted, created and resized.

    scripts/kill9-volumes.py TESSERA DIR ROUNDS SEED [serve flags...]

DIR/array is an array made by `tessera create` (its default volume left
alone). Four threads, one a volume (v0..v3, 4 GiB each, made in round 0),
write tagged 4 KiB blocks through libnbd over a fixed sample of the
volume's blocks, FLUSH every 16 writes, and now and then, through
`tessera volume` while the array is served, delete the volume and create
it again, or shrink it to half and grow it back. Each round serves the
array, checks every volume, lets the threads run for 0.5 to ROUND_S
seconds (env, default 4) and kills the server with SIGKILL; a last
serving checks the last kill. The checks:
a volume operation that returned holds (a volume there, gone, of its
size, reading zeros where it was made or cut); one cut short by the kill
left the volume as before it or as after it; each block holds its last
FLUSHed version or one written since, whole, of its own volume and
place. Exits non-zero on the first round that fails. Needs python3-libnbd
(Debian's python3).
"""
import json, os, random, struct, subprocess, sys, threading, time
import nbd

tessera, d, rounds, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flags = sys.argv[5:]
rng = random.Random(seed)
sock = os.path.join(d, "s.sock")
arr = os.path.join(d, "array")
THREADS = 4
BLOCKS = 2000
SIZE = 4 << 30


def block_bytes(vol, block, version):
    head = struct.pack("<QQQ", vol, block, version)
    return head + random.Random((vol << 56) | (block << 24) | version).randbytes(4096 - 24)


def serve():
    if os.path.exists(sock):
        os.unlink(sock)
    log = open(os.path.join(d, "serve.log"), "a")
    p = subprocess.Popen([tessera, "serve", arr, "--socket", sock] + flags, stdout=log, stderr=log)
    for _ in range(1200):
        if os.path.exists(sock) and os.path.exists(os.path.join(arr, "control.sock")):
            return p
        if p.poll() is not None:
            sys.exit(f"serve exited {p.returncode}; see serve.log")
        time.sleep(0.05)
    sys.exit("no socket")


def vol(*args):
    return subprocess.run([tessera, "volume", *args], capture_output=True, text=True)


def connect(name):
    h = nbd.NBD()
    h.set_export_name(name)
    h.connect_unix(sock)
    return h


class Vol:
    def __init__(self, i):
        self.i = i
        self.name = f"v{i}"
        self.blocks = sorted(random.Random(seed * 7 + i).sample(range(SIZE // 4096), BLOCKS))
        self.model = {b: (0, []) for b in self.blocks}  # durable version, maybe since
        self.counter = {b: 0 for b in self.blocks}
        self.exists = False
        # An operation cut short: None, or its name.
        self.cut = None


def run(v, stop, rng_t, out):
    h = None
    pending = {}
    n = 0

    def flushed():
        h.flush()
        for pb, vs in pending.items():
            v.model[pb] = (vs[-1], [])
        pending.clear()
        out[v.i] += 1

    try:
        while not stop.is_set():
            if h is None:
                h = connect(v.name)
            r = rng_t.random()
            if r < 0.004:
                # What was written before goes durable first, so that
                # the operation alone decides what the blocks hold.
                flushed()
                h.shutdown()
                h = None
                kind = "recycle" if rng_t.random() < 0.6 else "shrink"
                v.cut = kind
                if kind == "recycle":
                    res = vol("delete", arr, v.name)
                    if res.returncode != 0:
                        return
                    v.exists = False
                    res = vol("create", arr, v.name, "--size", str(SIZE))
                    if res.returncode != 0:
                        v.cut = "create"
                        return
                    v.exists = True
                    for b in v.blocks:
                        v.model[b] = (0, [])
                else:
                    res = vol("resize", arr, v.name, "--size", str(SIZE // 2))
                    if res.returncode != 0:
                        return
                    for b in v.blocks:
                        if b * 4096 >= SIZE // 2:
                            v.model[b] = (0, [])
                    v.cut = "grow"
                    res = vol("resize", arr, v.name, "--size", str(SIZE))
                    if res.returncode != 0:
                        return
                v.cut = None
                ops[kind] = ops.get(kind, 0) + 1
                continue
            b = rng_t.choice(v.blocks)
            durable, maybe = v.model[b]
            v.counter[b] += 1
            ver = v.counter[b]
            pending.setdefault(b, []).append(ver)
            v.model[b] = (durable, maybe + [ver])
            h.pwrite(block_bytes(v.i, b, ver), b * 4096)
            n += 1
            if n % 16 == 0:
                flushed()
    except nbd.Error:
        pass


vols = [Vol(i) for i in range(THREADS)]
ops = {}
# One more serving than kills, so that the last kill is checked too.
for r in range(rounds + 1):
    p = serve()
    res = vol("list", arr, "--json")
    if res.returncode != 0:
        sys.exit(f"list: {res.stderr}")
    listed = {x["name"]: x for x in json.loads(res.stdout)}
    bad = 0
    for v in vols:
        there = v.name in listed
        if there and listed[v.name]["bytes"] != SIZE:
            # A shrink then a grow cut short: grow it back.
            assert v.cut in ("grow", "shrink"), (v.name, listed[v.name], v.cut)
            assert vol("resize", arr, v.name, "--size", str(SIZE)).returncode == 0
        if not there:
            assert not v.exists or v.cut == "recycle", (r, v.name, "gone", v.cut)
            assert vol("create", arr, v.name, "--size", str(SIZE)).returncode == 0
            for b in v.blocks:
                v.model[b] = (0, [])
            v.exists, v.cut = True, None
            continue
        assert v.exists or v.cut in ("create", "recycle") or r == 0, (r, v.name, "there", v.cut)
        h = connect(v.name)
        got = {}
        for b in v.blocks:
            data = h.pread(4096, b * 4096)
            if data == bytes(4096):
                got[b] = 0
                continue
            vi, blk, ver = struct.unpack("<QQQ", data[:24])
            if data != block_bytes(vi, blk, ver) or blk != b or vi != v.i:
                print(f"round {r}: {v.name} block {b} torn or foreign: {data[:24].hex()}", flush=True)
                bad += 1
                got[b] = -1
                continue
            got[b] = ver
        h.shutdown()
        zeros = all(x == 0 for x in got.values())
        # A recycle cut short may have left the volume new (zeros);
        # a shrink cut short, the upper half zeros.
        for b in v.blocks:
            durable, maybe = v.model[b]
            ok = got[b] == durable or got[b] in maybe
            if v.cut in ("recycle", "create") and zeros:
                ok = True
            if v.cut in ("shrink", "grow") and b * 4096 >= SIZE // 2 and got[b] == 0:
                ok = True
            if not ok:
                print(f"round {r}: {v.name} block {b} holds {got[b]}; durable {durable}, maybe {maybe[-4:]}, cut {v.cut}", flush=True)
                bad += 1
            v.model[b] = (got[b], [])
        v.exists, v.cut = True, None
    if bad:
        p.kill()
        sys.exit(f"round {r}: {bad} bad blocks")
    if r == rounds:
        p.terminate()
        p.wait()
        print(f"round {r}: checked the last kill; operations {ops}", flush=True)
        break
    stop = threading.Event()
    out = [0] * THREADS
    ts = [threading.Thread(target=run, args=(v, stop, random.Random(seed * 1000 + r * 10 + v.i), out)) for v in vols]
    for t in ts:
        t.start()
    time.sleep(rng.uniform(0.5, float(os.environ.get("ROUND_S", "4"))))
    p.kill()
    p.wait()
    stop.set()
    for t in ts:
        t.join()
    print(f"round {r}: checked; then {sum(out)} flushed batches before kill -9; operations so far {ops}; cut {[v.cut for v in vols]}", flush=True)
print("ok")
