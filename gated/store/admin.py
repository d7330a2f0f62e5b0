"""`gated backup` and `gated inspect`: safe to run while the daemon writes.

Both use the environment this process already has open for the state dir, or open it
read-only (LMDB readers never block the writer). A backup is LMDB's compacting copy, made
inside one read transaction: a consistent snapshot of everything committed at that moment.
"""

from __future__ import annotations

import os
import time
from typing import Any

import lmdb

from .codec import from_u64, unpack
from .disk import human
from .env import DB_NAMES, EnvHandle, acquire, current, release
from .errors import StoreError
from .replay import _NL, _NU, _SEEN


def _handle(state_dir: str | os.PathLike[str]) -> tuple[EnvHandle, bool]:
    h = current(state_dir)
    if h is not None:
        return h, False
    return acquire(state_dir, readonly=True), True


def backup(state_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> dict[str, Any]:
    """Write a consistent, compacted copy of ``state_dir`` into directory ``dest``.

    ``dest`` is created; it must not already hold a state (no data.mdb). The copy is a
    complete state dir: point ``--state-dir`` at it to restore. Returns {dest, bytes,
    seconds}.
    """
    src, dst = os.path.realpath(os.fspath(state_dir)), os.path.realpath(os.fspath(dest))
    if src == dst:
        raise StoreError("backup destination is the state dir itself; choose another DEST")
    if os.path.exists(os.path.join(dst, "data.mdb")):
        raise StoreError(f"{dst} already holds a gated state (data.mdb); choose an empty or "
                         "new directory so no backup is overwritten")
    os.makedirs(dst, mode=0o750, exist_ok=True)
    h, opened = _handle(src)
    t0 = time.perf_counter()
    try:
        while True:
            try:
                with h.gate.shared():
                    assert h.env is not None
                    h.env.copy(dst, compact=True)
                break
            except lmdb.MapResizedError:
                h.remap()
    except lmdb.Error as e:
        tmp = os.path.join(dst, "data.mdb")
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise StoreError(f"backup of {src} to {dst} failed: {e}; the state itself is "
                         "untouched; check free space at the destination and retry") from e
    finally:
        if opened:
            release(h)
    size = os.path.getsize(os.path.join(dst, "data.mdb"))
    return {"dest": dst, "bytes": size, "seconds": time.perf_counter() - t0}


def inspect(state_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Counts, versions, step and sizes of a state dir, as plain data (JSON-friendly)."""
    path = os.path.realpath(os.fspath(state_dir))
    h, opened = _handle(path)
    try:
        def fn(txn: lmdb.Transaction) -> dict[str, Any]:
            def db(name: str) -> Any:
                return h.db(name)

            def entries(name: str) -> int:
                d = db(name)
                return txn.stat(d)["entries"] if d is not None else 0

            def meta_int(key: bytes) -> int | None:
                d = db("meta")
                raw = txn.get(key, db=d) if d is not None else None
                return from_u64(raw) if raw is not None else None

            out: dict[str, Any] = {"state_dir": path}
            meta = db("meta")
            fmt = txn.get(b"format", db=meta) if meta is not None else None
            out["format"] = int(fmt) if fmt is not None else None

            sig = db("signals")
            first = last_key = None
            if sig is not None:
                cur = txn.cursor(db=sig)
                if cur.first():
                    first = from_u64(cur.key())
                if cur.last():
                    last_key = from_u64(cur.key())
            out["signals"] = {"count": entries("signals"), "first_seq": first,
                              "last_seq": meta_int(b"last_seq") or last_key or 0,
                              "dedup_ids": entries("dedup")}
            fp = {"false_positive": 0, "false_negative": 0}
            fdb = db("fingerprints")
            if fdb is not None:
                for key in txn.cursor(db=fdb).iternext(keys=True, values=False):
                    fp["false_positive" if key[:1] == b"P" else "false_negative"] += 1
            out["escalation_fingerprints"] = fp

            rdb = db("replay")
            counters = [txn.get(k, db=rdb) if rdb is not None else None
                        for k in (_NU, _NL, _SEEN)]
            nu, nl, seen = (from_u64(c) if c is not None else 0 for c in counters)
            out["replay"] = {"size": nu + nl, "locked": nl, "seen_unlocked": seen}

            cdb = db("ckpt")
            head = txn.get(b"head", db=cdb) if cdb is not None else None
            if head is not None:
                hd = unpack(head)
                out["checkpoint"] = {"step": hd["step"],
                                     "last_trained_seq": hd["last_trained_seq"],
                                     "config_fingerprint": hd["config_fingerprint"],
                                     "params": hd["n"], "dtype": hd["dtype"],
                                     "tensors": len(hd["layout"]),
                                     "ewc": sorted(hd.get("ewc", {})),
                                     "saved_at": hd.get("saved_at"),
                                     "extra": hd.get("extra")}
            else:
                out["checkpoint"] = None

            pdb = db("published")
            cur_v = txn.get(b"current", db=pdb) if pdb is not None else None
            if cur_v is not None:
                ph = unpack(txn.get(b"h" + cur_v, db=pdb))
                kept = []
                c = txn.cursor(db=pdb)
                if c.set_range(b"h"):
                    for key in c.iternext(keys=True, values=False):
                        if not key.startswith(b"h"):
                            break
                        kept.append(from_u64(key[1:]))
                out["published"] = {"version": ph["version"], "step": ph["step"],
                                    "params": ph["n"], "saved_at": ph.get("saved_at"),
                                    "kept_versions": kept}
            else:
                out["published"] = None

            mdb = db("metrics")
            last_metrics = None
            if mdb is not None:
                c = txn.cursor(db=mdb)
                if c.last():
                    last_metrics = unpack(c.value())
            out["metrics"] = {"records": entries("metrics"), "last": last_metrics}
            out["trust"] = {"overrides": entries("overrides"), "audit": entries("audit")}

            assert h.env is not None
            info, st = h.env.info(), h.env.stat()
            psize = st["psize"]
            sizes = {}
            for name in DB_NAMES:
                d = db(name)
                if d is not None:
                    s = txn.stat(d)
                    sizes[name] = (s["branch_pages"] + s["leaf_pages"]
                                   + s["overflow_pages"]) * psize
            data_file = os.path.join(path, "data.mdb")
            out["sizes"] = {"file_bytes": os.path.getsize(data_file),
                            "map_bytes": info["map_size"],
                            "used_bytes": (info["last_pgno"] + 1) * psize,
                            "page_size": psize, "per_db_bytes": sizes}
            out["readers"] = {"active": info["num_readers"], "max": info["max_readers"]}
            return out
        return h.read(fn)
    finally:
        if opened:
            release(h)


def _ts(t: float | None) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def format_inspect(info: dict[str, Any]) -> str:
    """`inspect` output for a person: one fact per line."""
    s, sz = info["signals"], info["sizes"]
    lines = [f"state dir     {info['state_dir']} (format {info['format']})",
             f"signals       {s['count']:,} stored"
             + (f" (seq {s['first_seq']}..{s['last_seq']})" if s["count"] else "")
             + f", last seq {s['last_seq']:,}, {s['dedup_ids']:,} ids for dedup"]
    fp = info["escalation_fingerprints"]
    lines.append(f"escalation    {fp['false_positive']:,} false-positive and "
                 f"{fp['false_negative']:,} false-negative contexts counted")
    r = info["replay"]
    lines.append(f"replay        {r['size']:,} examples ({r['locked']:,} locked), "
                 f"{r['seen_unlocked']:,} offered")
    c = info["checkpoint"]
    if c:
        lines.append(f"checkpoint    step {c['step']:,}, trained through seq "
                     f"{c['last_trained_seq']:,}, {c['params']:,} params ({c['tensors']} "
                     f"tensors), config {c['config_fingerprint']}, saved {_ts(c['saved_at'])}")
    else:
        lines.append("checkpoint    none (the daemon starts from fresh weights)")
    p = info["published"]
    if p:
        lines.append(f"published     version {p['version']} (step {p['step']:,}), kept "
                     f"{p['kept_versions']}, saved {_ts(p['saved_at'])}")
    else:
        lines.append("published     none")
    m = info["metrics"]
    last = m["last"] or {}
    lines.append(f"metrics       {m['records']:,} records" +
                 (f", last step {last.get('step')}" if last else ""))
    t = info.get("trust") or {}
    lines.append(f"trust         {t.get('overrides', 0):,} overrides, "
                 f"{t.get('audit', 0):,} audit records (gated audit)")
    per_db = ", ".join(f"{k} {human(v)}" for k, v in sz["per_db_bytes"].items() if v)
    lines.append(f"size          file {human(sz['file_bytes'])}, used {human(sz['used_bytes'])},"
                 f" map {human(sz['map_bytes'])}")
    lines.append(f"              {per_db or 'empty'}")
    lines.append(f"readers       {info['readers']['active']} of {info['readers']['max']} slots")
    return "\n".join(lines)
