"""The per-tool view: progressive validation split by tool, bounded cardinality, in the
trainer's Prometheus series and in `gated report`."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from gated.config import TrainConfig
from gated.daemon.metrics import Metrics
from gated.daemon.trainer import build_trainer
from gated.engine import ModelConfig
from gated.online.per_tool import OTHER, PerTool, tool_of
from gated.store import Store


def test_tool_of_is_the_calls_first_word():
    assert tool_of('shell.exec {"cmd": "ls"}') == "shell.exec"
    assert tool_of("  fs.read   x") == "fs.read"
    assert tool_of("") == "?"
    assert tool_of("a\x00b c") == "a?b"


def test_stats_per_tool_and_the_rest_pooled_as_other():
    pt = PerTool(window=100, top=2)
    for _ in range(10):
        pt.observe("shell.exec", 0.2, 0.0)  # predicted block, truly block: tp
        pt.observe("shell.exec", 0.9, 0.0)  # predicted allow, truly block: fn
    for _ in range(6):
        pt.observe("fs.read", 0.9, 1.0)  # tn
    pt.observe("git.push", 0.1, 1.0)  # fp
    pt.observe("db.query", 0.8, 1.0)  # tn
    s = pt.stats()
    assert set(s) == {"shell.exec", "fs.read", OTHER}
    assert s["shell.exec"]["confusion"] == {"tp": 10, "fp": 0, "tn": 0, "fn": 10}
    assert s["shell.exec"]["alignment"] == 0.5 and s["fs.read"]["alignment"] == 1.0
    assert s[OTHER]["signals"] == 2 and s[OTHER]["confusion"]["fp"] == 1
    assert abs(s["fs.read"]["ece"] - 0.1) < 1e-9  # p 0.9 vs all allowed


def test_at_most_max_tools_are_tracked_the_least_seen_dropped():
    pt = PerTool(window=10, top=5, max_tools=3)
    for tool, n in (("a", 5), ("b", 3), ("c", 1)):
        for _ in range(n):
            pt.observe(tool, 0.9, 1.0)
    pt.observe("d", 0.9, 1.0)  # c (1 signal) goes
    assert set(pt.volume) == {"a", "b", "d"}
    restored = PerTool(window=10, top=5, max_tools=3)
    restored.load(pt.state())
    assert restored.stats() == pt.stats()


def test_trainer_exports_per_tool_series_and_drops_tools_that_leave_the_top(tmp_path):
    store = Store(tmp_path / "state")
    settings = dataclasses.replace(TrainConfig(), promotion_holdout_share=0.0)
    trainer, _ = build_trainer(store, ModelConfig.tiny(), settings, seed=0)
    sigs = ([{"context": f"shell.exec rm -rf /x{i}", "decision": "block"} for i in range(30)]
            + [{"context": f"fs.read src/{i}.py", "decision": "allow"} for i in range(20)])
    store.append_signals(sigs)
    while trainer.status.last_trained_seq < len(sigs):
        trainer.train_on(store.read_signals(trainer.status.last_trained_seq, 25))
    stats = trainer.monitor.per_tool.stats()
    assert stats["shell.exec"]["signals"] == 30 and stats["fs.read"]["signals"] == 20
    m = Metrics(process_collector=False)
    m.set_per_tool(stats)
    assert m.registry.get_sample_value("gated_tool_signals", {"tool": "shell.exec"}) == 30
    cells = sum(m.registry.get_sample_value("gated_tool_confusion",
                                            {"tool": "fs.read", "cell": c})
                for c in ("tp", "fp", "tn", "fn"))
    assert cells == 20
    m.set_per_tool({"shell.exec": stats["shell.exec"]})
    assert m.registry.get_sample_value("gated_tool_signals", {"tool": "fs.read"}) is None
    trainer.checkpoint()
    store.close()
    out = subprocess.run([sys.executable, "-m", "gated", "report", "--state-dir",
                          str(tmp_path / "state"), "--out", str(tmp_path / "r.png")],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.startswith(("shell.exec", "fs.read"))}
    assert rows["shell.exec"][1] == "30" and rows["fs.read"][1] == "20"
    assert float(rows["fs.read"][2]) == stats["fs.read"]["alignment"]
