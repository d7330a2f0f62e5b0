"""Trust (issue 14): the override memory, operator rules, prediction ids, the audit log and
served alignment.

The daemon tests run a real `gated run` process over its real socket, with real LMDB;
the unit tests drive the override memory and the audit writer on a real LMDB Store (no
mocks). Agreement expiry is hard to force through training, so it is tested twice
without relying on what the model learns: through `OverrideMemory.observe_model` on a
real store, and end to end with `agree_margin = 0` and an override on the side the
serving model already takes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_proc import metric_samples, metric_value, start, wait_until

from gated.config import ConfigError, load_config
from gated.daemon.metrics import Metrics
from gated.daemon.trust import Override, OverrideMemory, TrustWriter
from gated.rules import RuleSet, tool_of
from gated.signals import context_fingerprint
from gated.store import Store, format_inspect, inspect, read_audit
from gated.store.trust import id_key

KiB = 1024

#: No swap after the trainer's first publish (so the serving version, and the prediction
#: cache under it, stay put while a test looks), no idle replay steps.
QUIET = """
[train]
swap_every_steps = 1000000
swap_every_seconds = 3600.0
idle_steps_per_second = 0.0
"""


def gated_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gated.cli", *args], capture_output=True,
                          text=True, timeout=120)


def stable_version(c) -> int:
    """Wait for the trainer's first publish to be the serving version."""
    return wait_until(lambda: (v := c.status()["version"]) >= 1 and v, what="version 1")


def scrape(d) -> dict:
    return metric_samples(d.scrape())


# --- 1. the override memory, end to end ------------------------------------------------------

def test_correction_is_honoured_on_the_next_predict_before_the_cache_then_expires(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(QUIET + "[overrides]\nttl_s = 4.0\nagree_margin = 0.5\n")
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            version = stable_version(c)
            call, hist = 'web.get {"url": "http://example.com/a"}', ["fs.read /etc/hosts"]
            first = c.predict(call, hist)
            assert first["source"] == "model" and first["version"] == version
            hits = c.status()["cache"]["hits"]
            again = c.predict(call, hist)  # the model's answer is cached now
            assert again["p_allow"] == first["p_allow"] and again["source"] == "model"
            assert c.status()["cache"]["hits"] == hits + 1
            # The correction says the opposite of the model's side of 0.5.
            fb = "false_positive" if first["p_allow"] < 0.5 else "false_negative"
            want = (1.0, "allow") if fb == "false_positive" else (0.0, "block")
            ack = c.signal({"context": call, "history": hist, "decision": "block"
                            if fb == "false_positive" else "allow", "feedback": fb})
            t_ack = time.monotonic()
            got = c.predict(call, hist)  # the very next request after the ack
            assert got["source"] == "override", got
            assert (got["p_allow"], got["band"]) == want and got["override"] == fb
            assert got["version"] == version  # the cached model answer was still there
            ex = c.explain(call, hist)
            assert ex["source"] == "override" and ex["band"] == want[1] and ex["reason"]
            # exact fingerprint: the same call with other whitespace, yes; another history, no
            assert c.predict(call.replace(" ", "   "), hist)["source"] == "override"
            assert c.predict(call, ["fs.read /etc/passwd"])["source"] == "model"
            assert c.predict(call)["source"] == "model"
            # a predict never writes a signal: the log holds the one correction
            assert c.status()["last_seq"] == ack["seq"] == 1
            assert c.status()["trust"]["overrides"]["entries"] == 1
            # TTL: the override goes, and the cached model answer is served again
            hits = c.status()["cache"]["hits"]
            back = wait_until(lambda: (r := c.predict(call, hist))["source"] == "model" and r,
                              timeout=20, interval=0.2, what="the override to expire")
            assert time.monotonic() - t_ack >= 4.0 - 0.5
            assert back["p_allow"] == first["p_allow"]
            assert c.status()["cache"]["hits"] > hits
        m = scrape(d)
        assert metric_value(m, "gated_override_hits_total") >= 3
        assert metric_value(m, "gated_override_expired_total", reason="ttl") == 1
        assert metric_value(m, "gated_override_expired_total", reason="agreed") == 0
    finally:
        assert d.stop() == 0


def test_label_of_each_correction_kind_and_persistence_across_a_restart(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(QUIET + "[overrides]\nagree_margin = 0.5\n")
    kinds = {"override_allow": ("allow", 1.0, "block"), "override_block": ("block", 0.0, "allow"),
             "false_positive": ("allow", 1.0, "block"),   # blocked, should have been allowed
             "false_negative": ("block", 0.0, "allow")}   # allowed, should have been blocked
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            res = c.signals([{"context": f"tool.{k} x", "decision": decision, "feedback": k}
                             for k, (_, _, decision) in kinds.items()])
            assert all("seq" in r for r in res)
            for k, (band, p, _) in kinds.items():
                r = c.predict(f"tool.{k} x")
                assert (r["source"], r["band"], r["p_allow"], r["override"]) == \
                    ("override", band, p, k)
            # a plain decision or a confirmation is not a correction
            c.signal({"context": "tool.plain x", "decision": "block"})
            c.signal({"context": "tool.confirm x", "decision": "block", "feedback": "confirm"})
            assert c.predict("tool.plain x")["source"] == "model"
            assert c.predict("tool.confirm x")["source"] == "model"
            # the newest correction of a call replaces the older one
            c.signal({"context": "tool.override_allow x", "decision": "allow",
                      "feedback": "override_block"})
            r = c.predict("tool.override_allow x")
            assert (r["band"], r["override"]) == ("block", "override_block")
    finally:
        assert d.stop() == 0
    with Store(d.state_dir) as s:  # persisted in LMDB (the daemon is stopped)
        assert s.overrides_count() == 4
    d2 = start(tmp_path, config=cfg, state_dir=d.state_dir)
    try:
        with d2.client() as c:
            r = c.predict("tool.false_negative x")
            assert (r["source"], r["band"]) == ("override", "block")
            r = c.predict("tool.override_allow x")
            assert (r["source"], r["band"]) == ("override", "block")
    finally:
        assert d2.stop() == 0


def test_override_expires_once_the_serving_model_agrees(tmp_path):
    """agree_margin = 0: an override on the side the serving model already takes expires
    at the model's first answer, asked off the reply's path."""
    cfg = tmp_path / "g.toml"
    cfg.write_text(QUIET + "[overrides]\nagree_margin = 0.0\n")
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            stable_version(c)
            call = "net.connect host=10.0.0.7 port=22"
            p = c.predict(call)["p_allow"]
            fb = "override_allow" if p >= 0.5 else "override_block"
            c.signal({"context": call, "decision": "allow", "feedback": fb})
            assert c.predict(call)["source"] == "override"  # served, then checked
            wait_until(lambda: c.predict(call)["source"] == "model", timeout=20,
                       what="the override to expire on agreement")
            assert c.status()["trust"]["overrides"]["entries"] == 0
        m = scrape(d)
        assert metric_value(m, "gated_override_expired_total", reason="agreed") == 1
        assert metric_value(m, "gated_override_expired_total", reason="ttl") == 0
    finally:
        assert d.stop() == 0


# --- 1b. the override memory on a real LMDB store ------------------------------------------

def _flush(writer: TrustWriter) -> None:
    writer.overrides([], []).result(timeout=10)


def test_override_memory_agreement_ttl_and_bound_on_a_real_store(tmp_path):
    now = [1000.0]
    with Store(tmp_path / "state") as s:
        writer = TrustWriter(s, queue_max=100, max_entries=100, max_age_s=0, window=10)
        expired: list[tuple[str, int]] = []
        mem = OverrideMemory(max_entries=3, ttl_s=60.0, agree_margin=0.4,
                             persist=writer.overrides,
                             on_expire=lambda r, n: expired.append((r, n)),
                             clock=lambda: now[0])
        fp = {k: context_fingerprint(f"tool.{k} x") for k in "abcd"}
        allow = Override(1, "false_positive", now[0], 1, "tool.a")
        block = Override(0, "override_block", now[0], 2, "tool.b")
        assert mem.remember([(fp["a"], allow), (fp["b"], block)]).result(timeout=10)
        assert sorted(k for k, _ in s.overrides_all()) == sorted([fp["a"], fp["b"]])
        # agreement needs the margin: allow at p >= 0.9, block at p <= 0.1
        assert not mem.observe_model(fp["a"], allow, 0.89, 1)
        assert not mem.observe_model(fp["b"], block, 0.11, 1)
        assert mem.lookup(fp["a"]) is allow and mem.lookup(fp["b"]) is block
        assert mem.observe_model(fp["a"], allow, 0.9, 2)
        assert mem.observe_model(fp["b"], block, 0.05, 2)
        assert mem.lookup(fp["a"]) is None and len(mem) == 0
        _flush(writer)
        assert s.overrides_all() == []  # the expiry is persisted
        assert expired == [("agreed", 1), ("agreed", 1)]
        # an old answer never expires a newer correction of the same call
        old = Override(1, "override_allow", now[0], 3, "tool.c")
        new = Override(0, "override_block", now[0], 4, "tool.c")
        mem.remember([(fp["c"], old)])
        mem.remember([(fp["c"], new)])
        assert not mem.observe_model(fp["c"], old, 0.99, 3)
        assert mem.lookup(fp["c"]) is new
        # the bound: the oldest goes first
        mem.remember([(fp["a"], Override(1, "false_positive", now[0], 5, "tool.a"))])
        mem.remember([(fp["b"], Override(1, "false_positive", now[0], 6, "tool.b"))])
        mem.remember([(fp["d"], Override(1, "false_positive", now[0], 7, "tool.d"))])
        assert len(mem) == 3 and mem.get(fp["c"]) is None
        assert ("evicted", 1) in expired
        # TTL, then a restart loads only what is live
        now[0] += 30.0
        mem.remember([(fp["c"], Override(0, "false_negative", now[0], 8, "tool.c"))])
        assert len(mem) == 3 and mem.get(fp["a"]) is None  # a evicted by c
        now[0] += 40.0  # b and d are 70 s old, c 40 s
        assert mem.lookup(fp["b"]) is None  # expired on lookup
        assert mem.sweep() == 1  # d
        _flush(writer)
        assert [k for k, _ in s.overrides_all()] == [fp["c"]]
        again = OverrideMemory(max_entries=3, ttl_s=60.0, agree_margin=0.4,
                               persist=writer.overrides, clock=lambda: now[0])
        again.load(s.overrides_all())
        assert len(again) == 1 and again.lookup(fp["c"]).label == 0
        writer.close()


# --- 2. operator rules ---------------------------------------------------------------------

def test_ruleset_deny_wins_tools_prefixes_regex():
    rules = RuleSet(allow_tools=["shell.exec", "fs.read"], deny_regex=[r"rm\s+-rf"],
                    deny_prefixes=["fs.read /etc/shadow"], allow_prefixes=["git  status"],
                    deny_tools=["net.raw"])
    m = rules.match('shell.exec {"cmd": "rm  -rf /"}')
    assert (m.action, m.rule, m.band, m.p_allow) == ("deny", r"deny_regex:rm\s+-rf", "block", 0.0)
    m = rules.match('shell.exec {"cmd": "ls"}')
    assert (m.action, m.rule, m.band, m.p_allow) == ("allow", "allow_tools:shell.exec",
                                                      "allow", 1.0)
    assert rules.match("fs.read   /etc/shadow").rule == "deny_prefixes:fs.read /etc/shadow"
    assert rules.match("fs.read /etc/hosts").rule == "allow_tools:fs.read"
    assert rules.match("  git status --short").rule == "allow_prefixes:git  status"
    assert rules.match("net.raw x").rule == "deny_tools:net.raw"
    assert rules.match("net.rawx y") is None  # tool names are exact
    assert rules.match("http.get x") is None
    assert tool_of("  shell.exec\t{}") == "shell.exec" and tool_of("") == ""
    assert len(RuleSet()) == 0 and RuleSet().match("anything") is None


@pytest.mark.parametrize("text, needles", [
    ('[rules]\ndeny_regex = ["ok", "(unclosed"]\n',
     ["rules.deny_regex", "invalid regular expression '(unclosed'"]),
    ('[rules]\nallow_regex = ["[z-a]"]\n', ["rules.allow_regex", "invalid regular"]),
    ('[rules]\ndeny_tools = "shell.exec"\n', ["rules.deny_tools", "array of strings"]),
    ('[rules]\nallow_prefixes = [1]\n', ["rules.allow_prefixes", "array of strings"]),
    ('[rules]\ndeny_prefixes = [" "]\n', ["rules.deny_prefixes", "blank"]),
    ('[overrides]\nagree_margin = 0.6\n', ["overrides.agree_margin", "<= 0.5"]),
    ('[overrides]\nttl_s = 0\n', ["overrides.ttl_s", "> 0"]),
])
def test_invalid_trust_config_names_the_key(tmp_path, text, needles):
    f = tmp_path / "g.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(f, env={})
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_rules_answer_first_never_train_and_reload_live(tmp_path):
    cfg = tmp_path / "g.toml"
    rules = ('[rules]\nallow_tools = ["shell.exec"]\ndeny_regex = ["rm\\\\s+-rf"]\n'
             'deny_tools = ["net.raw"]\n')
    cfg.write_text(QUIET + rules)
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            r = c.predict('shell.exec {"cmd": "rm  -rf /"}')  # allowed tool, denied pattern
            assert (r["source"], r["rule"], r["p_allow"], r["band"]) == \
                ("rule", r"deny_regex:rm\s+-rf", 0.0, "block")
            r = c.predict('shell.exec {"cmd": "ls"}', ["a"])
            assert (r["source"], r["rule"], r["p_allow"], r["band"]) == \
                ("rule", "allow_tools:shell.exec", 1.0, "allow")
            ex = c.explain("net.raw eth0")
            assert (ex["source"], ex["rule"], ex["band"]) == ("rule", "deny_tools:net.raw",
                                                              "block")
            assert "deny_tools:net.raw" in ex["reason"]
            # a rule comes before the override memory
            c.signal({"context": "net.raw eth0", "decision": "block",
                      "feedback": "false_positive"})
            assert c.predict("net.raw eth0")["source"] == "rule"
            # predictions answered by rules wrote nothing to the signal log
            assert c.status()["last_seq"] == 1
            assert c.status()["trust"]["rules"] == 3
            # hot reload: rewrite the file; the next predictions follow it
            cfg.write_text(QUIET + '[rules]\ndeny_tools = ["shell.exec"]\n')
            wait_until(lambda: c.predict('shell.exec {"cmd": "ls"}')["band"] == "block",
                       what="the reloaded rules")
            r = c.predict('shell.exec {"cmd": "ls"}')
            assert r["rule"] == "deny_tools:shell.exec"
            r = c.predict("net.raw eth0")  # no longer a rule: the override now answers
            assert (r["source"], r["band"]) == ("override", "allow")
            # an invalid regex is refused; the last good rules stay
            cfg.write_text(QUIET + '[rules]\ndeny_regex = ["(bad"]\n')
            wait_until(lambda: 'gated_config_reloads_total{result="failed"} 1.0'
                       in d.scrape(), what="the failed reload")
            assert c.predict('shell.exec {"cmd": "ls"}')["rule"] == "deny_tools:shell.exec"
        assert "rules.deny_regex" in d.log()
        m = scrape(d)
        assert metric_value(m, "gated_rule_hits_total", action="deny") >= 4
        assert metric_value(m, "gated_rule_hits_total", action="allow") >= 1
    finally:
        assert d.stop() == 0


# --- 3. prediction ids, the audit log, served alignment ---------------------------------------

def test_prediction_ids_link_outcomes_served_alignment_and_audit_cli(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(QUIET + '[rules]\ndeny_tools = ["shell.exec"]\n')
    d = start(tmp_path, config=cfg)
    try:
        with d.client() as c:
            stable_version(c)
            t0 = time.time()
            replies = []
            for i in range(60):
                tool = ("fs.read", "web.get", "shell.exec")[i % 3]
                op = c.explain if i % 10 == 0 else c.predict
                replies.append((tool, op(f"{tool} /path/{i}")))
            ids = [r["prediction_id"] for _, r in replies]
            assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)
            assert len(set(ids)) == len(ids) and ids == sorted(ids)  # unique, time-ordered
            # Outcomes: the gate agrees with some served answers and not with others.
            expect_agree = []
            sigs = []
            for n, (tool, r) in enumerate(replies[:30]):
                served_allow = r["p_allow"] >= 0.5
                agree = n % 3 != 0
                decision = "allow" if served_allow == agree else "block"
                sigs.append({"context": f"{tool} /path/{n}", "decision": decision,
                             "prediction_id": r["prediction_id"]})
                expect_agree.append(agree)
            sigs.append({"context": "x y", "decision": "allow",
                         "prediction_id": "00000000000000ff"})  # not one of ours
            sigs.append({"context": "x y", "decision": "allow", "prediction_id": "nope"})
            res = c.signals(sigs)
            assert all("seq" in r for r in res)
            # a re-sent signal (same id) is not counted twice
            c.signal({"id": "dup-1", **sigs[1]})
            c.signal({"id": "dup-1", **sigs[1]})
            want = (sum(expect_agree) + (1 if expect_agree[1] else 0)) / 31

            def aligned():
                m = scrape(d)
                return (metric_value(m, "gated_served_alignment_window_signals") == 31
                        and m)
            m = wait_until(aligned, what="31 linked outcomes")
            assert metric_value(m, "gated_served_alignment") == pytest.approx(want)
            assert metric_value(m, "gated_served_unlinked_total") == 2
            deny_agree = sum(1 for n, (tool, _) in enumerate(replies[:30])
                             if tool == "shell.exec" and expect_agree[n])
            assert metric_value(m, "gated_served_outcomes_total", source="rule", band="block",
                                result="agree") == deny_agree
            total = sum(v for lab, v in m["gated_served_outcomes_total"])
            assert total == 31
            st = c.status()["trust"]
            assert st["served_alignment"]["linked"] == 31
            assert st["served_alignment"]["unlinked"] == 2
            assert st["served_alignment"]["alignment"] == pytest.approx(want)
            wait_until(lambda: c.status()["trust"]["audit"]["written"] == 60,
                       what="the audit records written")
        # The CLI reads the audit log read-only while the daemon runs.
        out = gated_cli("audit", "--state-dir", str(d.state_dir), "--since", "600",
                        "--tool", "web.get", "--json")
        assert out.returncode == 0, out.stderr
        recs = json.loads(out.stdout)
        web = [(t, r) for t, r in replies if t == "web.get"]
        assert [r["prediction_id"] for r in recs] == [r["prediction_id"] for _, r in web]
        for rec, (_, r) in zip(recs, web, strict=True):
            assert rec["tool"] == "web.get" and rec["source"] == r["source"] == "model"
            assert rec["p_allow"] == pytest.approx(r["p_allow"]) and rec["band"] == r["band"]
            assert rec["version"] == r["version"] and rec["latency_ms"] >= 0
            assert rec["op"] == ("explain" if "reason" in r else "predict")
            assert t0 - 1 <= rec["ts"] <= time.time()
        linked = [rec for rec in recs if "outcome" in rec]
        assert len(linked) == 10 and all(rec["outcome"] in ("allow", "block") for rec in linked)
        text = gated_cli("audit", "--state-dir", str(d.state_dir), "--since", "600",
                         "--tool", "shell.exec")
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert len(lines) == 20 and all("deny_tools:shell.exec" in ln for ln in lines)
        assert "20 prediction(s)" in text.stderr
        iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 60))
        future = gated_cli("audit", "--state-dir", str(d.state_dir), "--since", iso, "--json")
        assert future.returncode == 0 and json.loads(future.stdout) == []
        assert gated_cli("audit", "--state-dir", str(d.state_dir), "--since",
                         "yesterday").returncode != 0
    finally:
        assert d.stop() == 0
    info = inspect(d.state_dir)
    assert info["trust"] == {"overrides": 0, "audit": 60}
    assert "60 audit records" in format_inspect(info)
    # ids keep growing across a restart (the newest stored id is the floor)
    last = max(ids)
    d2 = start(tmp_path, config=cfg, state_dir=d.state_dir)
    try:
        with d2.client() as c:
            assert c.predict("fs.read /x")["prediction_id"] > last
    finally:
        assert d2.stop() == 0


def _rec(i: int, ts: float) -> dict:
    return {"ts": ts, "op": "predict", "version": 1, "p_allow": 0.5, "band": "ask",
            "source": "model", "latency_ms": 1.0, "tool": f"t{i % 2}"}


def test_audit_retention_and_a_full_store_never_fails_a_prediction(tmp_path):
    base = 1_700_000_000.0
    with Store(tmp_path / "state") as s:
        # retention by count and by age, oldest first, in the writer's transaction
        found, pruned = s.audit_write([(int((base + i) * 1e6), _rec(i, base + i))
                                       for i in range(10)], max_entries=6, max_age_s=0,
                                      now=base + 10)
        assert pruned == 4 and s.audit_count() == 6
        assert [r["ts"] for r in read_audit(s.path)] == [base + i for i in range(4, 10)]
        _, pruned = s.audit_write([], max_entries=100, max_age_s=3.5, now=base + 10)
        assert pruned == 3 and s.audit_count() == 3  # older than base + 6.5
        assert [r["tool"] for r in read_audit(s.path, since=base + 8)] == ["t0", "t1"]
        assert [r["ts"] for r in read_audit(s.path, tool="t1")] == [base + 7, base + 9]
        assert [r["ts"] for r in read_audit(s.path, limit=1)] == [base + 9]
        key = id_key(f"{int((base + 9) * 1e6):016x}")
        found, _ = s.audit_write([], [(key, {"outcome": "allow", "seq": 5})],
                                 max_entries=100, now=base + 10)
        assert found[0]["band"] == "ask" and s.audit_get(key)["outcome"] == "allow"
        assert id_key("not-hex-at-all!!") is None and id_key("12") is None
    # A map that cannot grow: the writer drops, counts and logs; nothing raises.
    metrics = Metrics(process_collector=False)
    with Store(tmp_path / "small", map_size=64 * KiB, max_map_size=128 * KiB) as s:
        w = TrustWriter(s, queue_max=100_000, max_entries=10**6, max_age_s=0, window=10,
                        metrics=metrics)
        for i in range(3000):
            w.audit(int((base + i) * 1e6), _rec(i, base + i))
        w.close(timeout=30)
        assert w.dropped > 0 and w.written + w.dropped == 3000
        assert metrics.audit_dropped._value.get() == w.dropped
        # a full queue drops too, at once, without waiting
        w2 = TrustWriter(s, queue_max=1, max_entries=0, max_age_s=0, window=10)
        kept = [w2.audit(i, _rec(i, base)) for i in range(50)]
        assert not all(kept) and w2.dropped >= 1
        w2.close()


def test_daemon_on_a_full_disk_keeps_predicting_and_counts_dropped_audit(tmp_path):
    from test_store_full import _fill, _tmpfs

    mnt = _tmpfs(tmp_path, "24m")
    try:
        cfg = tmp_path / "d.toml"
        cfg.write_text(QUIET + "[daemon]\ndisk_free_min_mib = 2\ndisk_free_warn_mib = 1\n")
        d = start(tmp_path, config=cfg, state_dir=mnt / "state")
        try:
            with d.client() as c:
                stable_version(c)
                ballast = _fill(mnt)
                answered = 0
                for i in range(1500):
                    r = c.predict(f"fs.read /big/{i} " + "x" * 200)
                    assert r["ok"] and r["prediction_id"]
                    answered += 1
                dropped = wait_until(
                    lambda: metric_value(scrape(d), "gated_audit_dropped_total"),
                    timeout=20, what="dropped audit records to be counted")
                assert dropped > 0 and answered == 1500
                assert "audit record(s) dropped" in d.log()
                ballast.unlink()
                assert c.predict("fs.read /after")["source"] == "model"
        finally:
            assert d.stop() == 0, d.log()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_prediction_id_is_an_optional_signal_field_with_a_size_limit():
    from gated.config import Limits
    from gated.signals import SignalError, validate_signal

    base = {"context": "x y", "decision": "allow"}
    assert validate_signal(base)["prediction_id"] is None
    assert validate_signal({**base, "prediction_id": "00060a1b2c3d4e5f"})["prediction_id"] \
        == "00060a1b2c3d4e5f"
    for bad, code in (("", "invalid_value"), (7, "wrong_type"), ("p" * 65, "too_large")):
        with pytest.raises(SignalError) as info:
            validate_signal({**base, "prediction_id": bad})
        assert info.value.code == code
    with pytest.raises(SignalError):
        validate_signal({**base, "prediction_id": "p" * 9}, Limits(max_prediction_id_bytes=8))


def test_stored_signal_keeps_its_prediction_id(tmp_path):
    with Store(tmp_path / "state") as s:
        s.append_signals([{"context": "x y", "decision": "allow",
                           "prediction_id": "00060a1b2c3d4e5f"},
                          {"context": "x z", "decision": "allow"}])
        got = [rec["prediction_id"] for _, rec in s.read_signals(0, 10)]
    assert got == ["00060a1b2c3d4e5f", None]


def test_docs_show_each_trust_feature():
    root = Path(__file__).resolve().parents[1]
    ops = (root / "docs" / "operations.md").read_text()
    for needle in ("[rules]", "[overrides]", "[audit]", '"source": "override"',
                   '"source": "rule"', "gated audit --since", "gated_served_alignment"):
        assert needle in ops, needle
    proto = (root / "docs" / "protocol.md").read_text()
    for needle in ("prediction_id", "source", '"rule"', '"override"'):
        assert needle in proto, needle
