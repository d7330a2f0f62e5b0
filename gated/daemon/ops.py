"""The daemon's request path: `dispatch` and the handler of each op (the op table in
`Daemon.__init__` names them), and `Refused`.

It lives apart from server.py so the replies to requests read on their own, away from the
start-up, shutdown and trainer wiring of the rest of the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..protocol import ProtocolError, Request, error_reply, ok_reply
from ..signals import SignalError, validate_signal
from ..store import StoreError, StoreFullError
from .connections import Connection

log = logging.getLogger("gated")


class Refused(Exception):
    """Refuse a request with this error `code` (e.g. `overloaded`): raised by a part the
    daemon delegates to (a cluster role's signal path) when nothing was stored."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class OpHandlers:
    """Mixin of `Daemon`: the reply to each request. Uses the daemon's config, access
    policy, metrics, serving snapshot, micro-batcher, explain pool, trust, committer,
    supervisor, store, op table, `_draining` and `status()`, set up in `Daemon.__init__`
    and `Daemon.run`."""

    # --- requests (gated/daemon/connections.py reads them and writes the replies) ---------
    async def dispatch(self, req: Request, conn: Connection | None = None) -> dict[str, Any]:
        """The reply to one request from ``conn`` (its peer checked against [access])."""
        if conn is not None and not self.access.allows(req.op, conn.peer):
            return self._forbidden(req, conn)
        try:
            return await self.ops[req.op](req)
        except Refused as e:
            self.metrics.rejected(e.code)
            return error_reply(req.rid, e.code, str(e))
        except StoreFullError as e:
            log.error("storing signals failed, the disk or map is full: %s", e)
            return error_reply(req.rid, "store_full", f"the signals were NOT stored: {e}")
        except StoreError as e:
            log.error("storing signals failed: %s", e)
            return error_reply(req.rid, "internal", f"the signals were NOT stored: {e}")
        except Exception as e:  # noqa: BLE001 - one bad request never takes the daemon down
            log.exception("request %r failed", req.op)
            return error_reply(req.rid, "internal", f"{type(e).__name__}: {e}")

    def _forbidden(self, req: Request, conn: Connection) -> dict[str, Any]:
        message = self.access.refusal(req.op, conn.peer)
        self.metrics.refused(req.op)
        self.metrics.rejected("forbidden")
        if req.op not in conn.refused:  # once per op and connection, not per request
            conn.refused.add(req.op)
            log.warning("refused %s from %s: not in the [access] lists", req.op, conn.peer)
        return error_reply(req.rid, "forbidden", message)

    async def _op_ping(self, req: Request) -> dict[str, Any]:
        return ok_reply(req.rid, pong=True, version=self.serving.current.version)

    async def _op_status(self, req: Request) -> dict[str, Any]:
        return ok_reply(req.rid, **self.status())

    def _refuse_while_draining(self, req: Request) -> dict[str, Any] | None:
        if not self._draining:
            return None
        return error_reply(req.rid, "shutting_down", "the daemon is stopping; nothing was "
                           "stored, resend after it restarts")

    async def _op_signal(self, req: Request) -> dict[str, Any]:
        refused = self._refuse_while_draining(req)
        if refused:
            return refused
        result = (await self._ingest([req.signal]))[0]
        if "error" in result:
            return error_reply(req.rid, result["error"]["code"], result["error"]["message"])
        return ok_reply(req.rid, **result)

    async def _op_signals(self, req: Request) -> dict[str, Any]:
        refused = self._refuse_while_draining(req)
        if refused:
            return refused
        return ok_reply(req.rid, results=await self._ingest(req.signals or []))

    async def _op_rollback(self, req: Request) -> dict[str, Any]:
        """Republish a kept earlier version (the trainer does it, one transaction) and
        train on from it, or pause training (`pause`)."""
        to, pause = req.args["to"], req.args["pause"]
        info = await asyncio.get_running_loop().run_in_executor(
            None, self.store.published_info)
        kept = (info or {}).get("kept", [])
        if to not in kept:
            return error_reply(req.rid, "invalid_value", f"version {to} is not kept; the "
                               f"kept published versions are {kept}")
        if not self.supervisor.alive():
            return error_reply(req.rid, "overloaded", "the trainer process is restarting; "
                               "nothing was changed, retry in a few seconds")
        log.warning("operator rollback to version %d requested (pause: %s)", to, pause)
        self.supervisor.rollback(to, pause)
        return ok_reply(req.rid, requested=True, to=to, pause=pause,
                        version=self.serving.current.version)

    async def _op_resume(self, req: Request) -> dict[str, Any]:
        self.supervisor.resume()
        return ok_reply(req.rid, resumed=True)

    async def _ingest(self, entries: list) -> list[dict]:
        """Validate (once, against the configured [limits]), group-commit, acknowledge:
        a result per entry, in order."""
        results: list[dict | None] = [None] * len(entries)
        valid, where = [], []
        for i, entry in enumerate(entries):
            if isinstance(entry, ProtocolError):
                results[i] = {"error": entry.as_dict()}
                continue
            try:
                valid.append(validate_signal(entry, self.cfg.limits))
                where.append(i)
            except SignalError as e:
                results[i] = {"error": e.to_dict()}
        for r in results:
            if r is not None:
                self.metrics.rejected(r["error"]["code"])
        if valid:
            self.serving.served.attach(valid)  # the logits served for them (`ServedDeep`)
            acks = await self.committer.submit_async(valid)
            for i, (seq, dup) in zip(where, acks, strict=True):
                results[i] = {"seq": seq, "duplicate": dup}
            self.metrics.received(len(valid))
            self.supervisor.wake()
            # Corrections enter the override memory before the reply (the next predict
            # honours them), and the reply waits for their LMDB commit; outcomes are
            # linked to the served predictions they reference.
            stored = self.trust.on_signals(valid, acks)
            if stored is not None:
                await asyncio.wrap_future(stored)
        return results  # type: ignore[return-value]

    async def _op_predict(self, req: Request) -> dict[str, Any]:
        """Operator rules, then the override memory, then the model (cache, then the
        micro-batcher); the reply says which (`source`) and carries a `prediction_id`."""
        t0 = time.perf_counter()
        out = self.trust.decide(req.context, req.history or None)
        if out is None:
            out = self.serving.cached(req.context, req.history or None)
            if self.serving.cache.size > 0:
                self.metrics.cache_lookups.labels(result="miss" if out is None
                                                  else "hit").inc()
            if out is None:
                out = await asyncio.wrap_future(self.batcher.submit(req.context,
                                                                    req.history or None))
            out["source"] = "model"
        seconds = time.perf_counter() - t0
        self.metrics.observe_predict(seconds, "predict")
        return ok_reply(req.rid, **self.trust.stamp(out, "predict", req.context, seconds))

    async def _op_explain(self, req: Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        out = self.trust.decide(req.context, req.history or None)
        if out is not None:
            out["reason"] = (f"operator rule {out['rule']}" if out["source"] == "rule" else
                             f"a person's correction of this call ({out['override']})")
        else:
            out = await asyncio.get_running_loop().run_in_executor(
                self._explain_pool, self.serving.explain, req.context, req.history or None)
            out["source"] = "model"
        seconds = time.perf_counter() - t0
        self.metrics.observe_predict(seconds, "explain")
        return ok_reply(req.rid, **self.trust.stamp(out, "explain", req.context, seconds))
