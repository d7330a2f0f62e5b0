"""Resuming: the trainer and its serving snapshot from the last checkpoint and the last
published weights (or a fresh start)."""

from __future__ import annotations

import secrets

from ...config import TrainConfig
from ...engine import Model, ModelConfig
from ..serving import Serving
from .loop import Trainer


def build_trainer(store, model_cfg: ModelConfig, settings: TrainConfig, *, seed: int = 0,
                  backend: str = "numpy", serving_bands=None, events=None,
                  reinit: bool = False) -> tuple[Trainer, Serving]:
    """Resume from the last checkpoint (or start fresh) and build the serving snapshot."""
    ckpt = None if reinit else store.load_checkpoint(layout=Model.init(
        model_cfg, seed=seed).layout, config_fingerprint=model_cfg.fingerprint())
    if ckpt is None:
        model = Model.init(model_cfg, seed=seed, backend=backend)
        step, version, last_seq, opt_state, ewc_state, window = 0, 0, 0, None, None, []
        monitor = None
    else:
        model = Model.from_flat(model_cfg, ckpt.flat, backend=backend)
        extra = ckpt.extra or {}
        step, last_seq = ckpt.step, ckpt.last_trained_seq
        version = int(extra.get("version", 0))
        opt_state = {"m": ckpt.m, "v": ckpt.v, "t": int(extra.get("opt_t", ckpt.step))}
        ewc_state = ckpt.ewc
        window = extra.get("window") or []
        monitor = extra.get("monitor")
    published = store.load_published_head() if not reinit else None
    if published is not None and published[0] >= version:
        # the transformer's token (`Snapshot.deep`): the one serving has with these weights
        version, serve_flat, deep = published[0], published[1], published[2].get("deep")
    else:  # weights of this process's own: a token of its own (serving never has it)
        serve_flat, deep = model.ops.to_numpy(model.flat), secrets.randbits(62)
    serving = Serving(model_cfg, serve_flat, version, step, backend=backend, bands=serving_bands,
                      deep=deep)
    trainer = Trainer(store, serving, model, settings, step=step, version=version,
                      last_trained_seq=last_seq, opt_state=opt_state, ewc_state=ewc_state,
                      events=events, seed=seed)
    trainer.window.load(window)
    trainer.monitor.load(monitor)
    trainer.apply_drift_verdicts()  # an alarm that waited for corrections stands
    serving.calibration = trainer.served_calibration()
    return trainer, serving
