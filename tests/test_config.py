"""Config: precedence, strict validation, the example file, reload policy, file watching."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gated.config import (
    ALL_KEYS,
    SAFE_KEYS,
    Config,
    ConfigError,
    cli_overrides,
    default_config,
    diff_reload,
    key_doc,
    load_config,
)
from gated.daemon.metrics import Metrics
from gated.daemon.reload import ConfigWatcher, Reloader

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "gated.example.toml"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- defaults, example file, precedence ------------------------------------------------

def test_defaults():
    cfg = load_config(None, env={})
    assert cfg == Config() == default_config({})
    assert cfg.daemon.state_dir == "./var/gated"
    assert cfg.daemon.socket == "./var/gated.sock"
    assert cfg.daemon.metrics_addr == "127.0.0.1:9464"
    assert cfg.daemon.device == "auto" and cfg.daemon.preset == "flint"
    assert cfg.train.lr == 1e-3 and cfg.train.lambda_bce == 1.0 and cfg.train.lambda_ce == 0.5
    assert cfg.train.lambda_ewc == 0.0 and cfg.train.replay_fraction == 0.5
    assert cfg.train.replay_slots == 10000 and cfg.train.alignment_window == 1000
    assert cfg.weights.fp_fn == (4.0, 6.0, 8.0)
    assert (cfg.bands.allow, cfg.bands.block) == (0.9, 0.1)
    assert cfg.get("train.lr") == 1e-3
    assert cfg.to_dict()["weights"]["fp_fn"] == [4.0, 6.0, 8.0]


def test_state_directory_from_systemd():
    env = {"STATE_DIRECTORY": "/var/lib/gated:/var/lib/other"}
    assert load_config(None, env=env).daemon.state_dir == "/var/lib/gated"


def test_example_file_is_the_defaults():
    assert load_config(EXAMPLE, env={}) == Config()


def test_example_file_documents_every_key_and_its_reload_policy():
    section, marker, seen = None, None, {}
    for line in EXAMPLE.read_text().splitlines():
        if m := re.match(r"^\[(\w+)\]", line):
            section, marker = m.group(1), None
            continue
        if m := re.search(r"\((hot|restart)\)", line):
            marker = m.group(1)
        if section and (m := re.match(r"^#?\s*(\w+)\s*=", line)):
            seen[f"{section}.{m.group(1)}"] = marker
    assert sorted(seen) == sorted(ALL_KEYS), "keys in the example file != config keys"
    wrong = [k for k, mark in seen.items() if (mark == "hot") != (k in SAFE_KEYS)]
    assert not wrong, f"(hot)/(restart) markers disagree with SAFE_KEYS for {wrong}"
    assert all(key_doc(k) for k in ALL_KEYS)


def test_precedence_defaults_file_flags(tmp_path):
    f = write(tmp_path / "g.toml", """
[daemon]
state_dir = "/srv/file-state"
socket = "/tmp/file.sock"
device = "cpu"
[train]
lr = 0.002
""")
    env = {"STATE_DIRECTORY": "/var/lib/gated"}
    cfg = load_config(f, env=env)
    assert cfg.daemon.state_dir == "/srv/file-state"   # file beats $STATE_DIRECTORY
    assert cfg.train.lr == 0.002 and cfg.train.lambda_ce == 0.5
    args = argparse.Namespace(cmd="run", config=str(f), state_dir=None,
                              socket="/tmp/flag.sock", metrics_addr="127.0.0.1:0",
                              device=None, preset="tiny", reinit=False)
    cfg = load_config(f, cli_overrides(args), env=env)
    assert cfg.daemon.socket == "/tmp/flag.sock"        # flag beats file
    assert cfg.daemon.device == "cpu"                   # file kept where no flag
    assert cfg.daemon.preset == "tiny" and cfg.daemon.metrics_addr == "127.0.0.1:0"
    assert cfg.daemon.state_dir == "/srv/file-state"
    # bare keys resolve to their (unique) section
    assert load_config(None, {"lr": 0.01, "bands.allow": 0.8}, env={}).train.lr == 0.01


def test_log_level_is_case_insensitive(tmp_path):
    f = write(tmp_path / "g.toml", '[daemon]\nlog_level = "debug"\n')
    assert load_config(f, env={}).daemon.log_level == "DEBUG"


def test_metrics_can_be_disabled(tmp_path):
    f = write(tmp_path / "g.toml", '[daemon]\nmetrics_addr = ""\n')
    assert load_config(f, env={}).daemon.metrics_addr == ""


def test_config_package_imports_nothing_of_the_daemon():
    code = ("import sys, gated.config; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('gated', 'watchdog', 'lmdb', 'msgpack', 'prometheus_client'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert out and all(m == "gated" or m.startswith("gated.config") for m in out), out


# --- invalid values ---------------------------------------------------------------------

@pytest.mark.parametrize("text, needles", [
    ("[trian]\nlr = 1e-3\n", ["unknown section [trian]", "did you mean 'train'"]),
    ("[train]\nlrr = 1e-3\n", ["unknown key train.lrr", "did you mean 'lr'"]),
    ("train = 3\n", ["train must be a table"]),
    ('[train]\nlr = "fast"\n', ["train.lr = 'fast'", "must be a number"]),
    ("[train]\nbatch_size = true\n", ["train.batch_size = True", "must be an integer"]),
    ("[train]\nbatch_size = 16.5\n", ["train.batch_size = 16.5", "must be an integer"]),
    ("[train]\nbatch_size = 0\n", ["train.batch_size = 0", "must be >= 1 and <= 4096"]),
    ("[train]\nlr = 0\n", ["train.lr = 0", "must be > 0 and <= 1"]),
    ("[train]\nlr = -1\n", ["train.lr = -1", "out of range"]),
    ("[train]\nlr = nan\n", ["train.lr = nan", "must be finite"]),
    ("[train]\nreplay_fraction = 1.0\n", ["train.replay_fraction = 1.0", "< 1"]),
    ("[train]\nlambda_bce = 0\nlambda_ce = 0\n", ["nothing would be learned"]),
    ('[daemon]\ndevice = "gpu"\n', ["daemon.device = 'gpu'", "'auto', 'cpu', 'cuda'"]),
    ('[daemon]\npreset = "huge"\n', ["daemon.preset = 'huge'", "'tiny', 'flint'"]),
    ('[daemon]\nlog_level = "loud"\n', ["daemon.log_level = 'loud'", "'DEBUG'"]),
    ('[daemon]\nmetrics_addr = "9464"\n', ["daemon.metrics_addr = '9464'", "HOST:PORT"]),
    ('[daemon]\nsocket = "/' + "s" * 120 + '"\n', ["daemon.socket", "at most 107 bytes"]),
    ('[daemon]\nstate_dir = ""\n', ["daemon.state_dir = ''", "must not be empty"]),
    ("[weights]\nfp_fn = []\n", ["weights.fp_fn = []", "non-empty array"]),
    ("[weights]\nfp_fn = [8, 4]\n", ["weights.fp_fn", "must not decrease"]),
    ("[weights]\noverride = 0\n", ["weights.override = 0", "> 0"]),
    ("[bands]\nallow = 0.2\nblock = 0.3\n", ["bands.block = 0.3", "block must be <= allow"]),
    ("[bands]\nallow = 1.5\n", ["bands.allow = 1.5", "<= 1"]),
    ("[limits]\nmax_batch = 0\n", ["limits.max_batch = 0", ">= 1"]),
    ("[limits]\nmax_batch = 20000\n", ["max_array_len (16384) must be at least max_batch"]),
    ("[limits]\nmax_id_bytes = 512\n", ["max_id_bytes (512) must be at most 511"]),
    ("[retention]\nmax_count = -1\n", ["retention.max_count = -1", ">= 0"]),
    ("[train\nlr = 1\n", ["not valid TOML"]),
])
def test_invalid_values_name_key_value_and_what_is_allowed(tmp_path, text, needles):
    f = write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as ei:
        load_config(f, env={})
    msg = str(ei.value)
    assert str(f) in msg
    for needle in needles:
        assert needle in msg, msg


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})


def test_invalid_overrides_name_the_command_line(tmp_path):
    with pytest.raises(ConfigError, match="command line: daemon.device = 'tpu'"):
        load_config(None, {"daemon.device": "tpu"}, env={})
    with pytest.raises(ConfigError, match="no such key"):
        load_config(None, {"learning_rate": 1.0}, env={})
    with pytest.raises(ConfigError, match="unknown key daemon.colour"):
        load_config(None, {"daemon.colour": "red"}, env={})


# --- reload policy ---------------------------------------------------------------------

def test_safe_keys():
    for key in ("train.lr", "train.lambda_bce", "train.lambda_ce", "train.lambda_ewc",
                "train.swap_every_steps", "train.swap_every_seconds", "train.batch_size",
                "train.replay_fraction", "bands.allow", "bands.block", "daemon.log_level",
                "weights.confirm", "weights.override", "weights.fp_fn",
                "train.converged_threshold"):
        assert key in SAFE_KEYS, key
    for key in ("daemon.state_dir", "daemon.socket", "daemon.metrics_addr", "daemon.device",
                "daemon.preset", "daemon.seed", "train.replay_slots",
                "train.alignment_window", "limits.max_message_bytes"):
        assert key not in SAFE_KEYS, key
    assert SAFE_KEYS <= set(ALL_KEYS)


def test_diff_reload_applies_safe_and_refuses_restart_keys():
    old = Config()
    new = dataclasses.replace(
        old, train=dataclasses.replace(old.train, lr=5e-4, replay_slots=99),
        daemon=dataclasses.replace(old.daemon, device="cpu", log_level="DEBUG"))
    applied, applied_keys, refused = diff_reload(old, new)
    assert applied_keys == ["daemon.log_level", "train.lr"]
    assert refused == ["daemon.device", "train.replay_slots"]
    assert applied.train.lr == 5e-4 and applied.daemon.log_level == "DEBUG"
    assert applied.daemon.device == "auto" and applied.train.replay_slots == 10000
    assert diff_reload(old, old) == (old, [], [])


class Recorder:
    def __init__(self):
        self.calls: list[tuple[Config, list[str]]] = []
        self.event = threading.Event()

    def __call__(self, cfg, keys):
        self.calls.append((cfg, keys))
        self.event.set()


def test_reloader_applies_refuses_and_keeps_last_good(tmp_path, caplog):
    f = write(tmp_path / "g.toml", "[train]\nlr = 0.001\n")
    overrides = {"daemon.socket": str(tmp_path / "flag.sock")}
    cfg = load_config(f, overrides, env={})
    rec, metrics = Recorder(), Metrics(process_collector=False)
    r = Reloader(f, overrides, cfg, rec, metrics=metrics, env={})
    caplog.set_level(logging.INFO, logger="gated.config")

    # a safe change applies; the restart-only one is refused with a message
    write(f, '[train]\nlr = 0.0005\n[daemon]\ndevice = "cpu"\nsocket = "/tmp/file.sock"\n')
    res = r.reload("SIGHUP")
    assert res.ok and res.applied_keys == ["train.lr"] and res.refused_keys == ["daemon.device"]
    assert r.current.train.lr == 0.0005 and r.current.daemon.device == "auto"
    assert r.current.daemon.socket == str(tmp_path / "flag.sock")  # the flag still wins
    assert rec.calls == [(r.current, ["train.lr"])]
    assert "train.lr 0.001 -> 0.0005" in caplog.text
    assert "need a restart: daemon.device 'auto' -> 'cpu'" in caplog.text

    # an invalid file changes nothing and says so
    caplog.clear()
    write(f, "[train]\nlr = -3\n")
    res = r.reload("file change")
    assert not res.ok and "train.lr = -3" in res.error
    assert r.current.train.lr == 0.0005 and res.config is r.current
    assert "keeping the last good config" in caplog.text
    assert len(rec.calls) == 1

    # a failing apply keeps the previous config too
    def boom(cfg, keys):
        raise RuntimeError("trainer gone")
    r2 = Reloader(f, None, cfg, boom, metrics=metrics, env={})
    write(f, "[train]\nlr = 0.002\n")
    res = r2.reload()
    assert not res.ok and "trainer gone" in res.error and r2.current == cfg

    reg = metrics.registry
    assert reg.get_sample_value("gated_config_reloads_total", {"result": "ok"}) == 1
    assert reg.get_sample_value("gated_config_reloads_total", {"result": "failed"}) == 2


def test_reload_notifies_systemd(tmp_path, notify_socket):
    f = write(tmp_path / "g.toml", "")
    Reloader(f, None, Config(), lambda c, k: None, env={}).reload()
    first = notify_socket.recv(4096).decode()
    assert first.startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert notify_socket.recv(4096) == b"READY=1"


# --- watching the file ------------------------------------------------------------------

def wait_for(pred, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_watcher_fires_once_per_change_in_place_and_by_rename(tmp_path):
    f = write(tmp_path / "gated.toml", "[train]\nlr = 0.001\n")
    calls: list[float] = []
    with ConfigWatcher(f, lambda: calls.append(time.monotonic()), debounce=0.3):
        # edited in place, in several writes (one save): one callback
        t0 = time.monotonic()
        with open(f, "w") as fh:
            fh.write("[train]\n")
            fh.flush()
            time.sleep(0.05)
            fh.write("lr = 0.002\n")
        assert wait_for(lambda: len(calls) == 1)
        assert calls[0] - t0 >= 0.2  # debounced
        time.sleep(0.4)
        assert len(calls) == 1

        # replaced by an atomic rename, as editors and config managers do: one callback
        tmp = tmp_path / ".gated.toml.swp"
        write(tmp, "[train]\nlr = 0.003\n")
        os.replace(tmp, f)
        assert wait_for(lambda: len(calls) == 2)

        # other files in the directory, and a save without changes, do nothing
        write(tmp_path / "other.toml", "x = 1\n")
        write(f, "[train]\nlr = 0.003\n")
        time.sleep(0.6)
        assert len(calls) == 2


def test_watcher_and_reloader_keep_the_last_good_config(tmp_path):
    f = write(tmp_path / "gated.toml", "[bands]\nallow = 0.9\n")
    rec = Recorder()
    r = Reloader(f, None, load_config(f, env={}), rec, env={}, notify=False)
    results = []
    with ConfigWatcher(f, lambda: results.append(r.reload("file change")), debounce=0.1):
        write(f, "[bands]\nallow = 0.8\n")
        assert wait_for(lambda: len(results) == 1)
        assert results[0].ok and r.current.bands.allow == 0.8
        write(f, "[bands]\nallow = 'high'\n")
        assert wait_for(lambda: len(results) == 2)
        assert not results[1].ok and r.current.bands.allow == 0.8
        f.unlink()  # deleted: nothing happens until a file is back
        time.sleep(0.3)
        write(f, "[bands]\nallow = 0.7\n")
        assert wait_for(lambda: len(results) == 3)
        assert results[2].ok and r.current.bands.allow == 0.7
    assert [keys for _, keys in rec.calls] == [["bands.allow"], ["bands.allow"]]


def test_watcher_survives_a_failing_callback(tmp_path):
    f = write(tmp_path / "gated.toml", "")
    n = []

    def cb():
        n.append(1)
        raise RuntimeError("boom")
    with ConfigWatcher(f, cb, debounce=0.05):
        write(f, "[train]\n")
        assert wait_for(lambda: len(n) == 1)
        write(f, "[train]\nlr = 0.01\n")
        assert wait_for(lambda: len(n) == 2)
