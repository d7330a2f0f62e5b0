"""The call x history pair term's features: which keys each side of the product gets.

The term itself (`pair_logit`: a product of ``wide.pair_call`` and ``wide.pair_hist``
rows, pooled over the history's entries) is in wide_logit.py, the rest of the wide
path's features in wide.py; this module says what the call's side and the history's side
of the product are made of: a call's site (its tool, method, whether it can carry data
out, where it sends to) and, per earlier call that read a file, that file's name, words
and marks.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

import numpy as np

from .known_names import egress_call, path_place, sensitive_file
from .wide import MAX_STRUCTURED, _bucket, _parse_call, call_destination

#: Words of a file name, for the history keys of the call x history pair term.
_NAME_WORD = re.compile(r"[A-Za-z0-9]+")


def destination_row(destination: str, buckets: int, destination_rows: int = 0) -> int:
    """The call side's row of the destination key ``p|dest|<destination>``: one of the
    `destination_rows` rows after the table's `buckets` (with 0 such rows: one of the
    buckets, hashed as the site's keys are)."""
    name = f"p|dest|{destination}"
    if not destination_rows:
        return _bucket(name, buckets)
    return buckets + _bucket(name, destination_rows + 1) - 1


def pair_features(context: str, history: Sequence[str] | None, buckets: int,
                  sensitive_scale: float = 0.0, egress_scale: float = 0.0,
                  destination_scale: float = 0.0, destination_rows: int = 0,
                  sensitive_places: bool = False, window: int = 0
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The two sides of the call x history pair term: (call idx, call val, history idx,
    history val, history entry), bucket ids in 1..buckets-1 (a destination key's call row
    in buckets..buckets+destination_rows-1 when there are such rows).

    - The call's site: its tool, and its tool and HTTP method when it has one, and, with
      `egress_scale` > 0, ``p|egress`` of that value when the call can carry data out
      (known_names.py `egress_call`: the one key mail shares with an HTTP upload); the
      site's values scaled to an L2 norm of 1, so a site with a method or the mark is not
      louder than one without. With `destination_scale` > 0, such a call also gets
      ``p|dest|<where it sends to>`` (`call_destination`) of that value, added after the
      normalisation: the history rule is "a secret read, then data sent OUTSIDE", and
      the org's own hosts (an allowed upload to ``jira.acme.io`` after a ``.env`` read)
      can only be told apart by where the call goes; outside the norm, the site's own
      keys keep their full value, and a destination never seen adds only its small
      initial factor (docs/learning.md, "A destination on the pair term"). With
      `destination_rows` > 0 the key goes to one of the `destination_rows` rows after the
      table's `buckets` (`destination_row`), and only on a call whose history, as the
      pair term reads it, holds a credential-file read
      (`ModelConfig.pair_destination_rows`; docs/learning.md, "The destination's own
      rows").
    - The history's keys: for every entry with a ``path`` argument, the entry's tool and
      the file's last component (``fs.read|.env``) and each word of that name (``env``,
      ``secrets``, ``yml``), value 1 each, deduplicated within the entry, with the
      entry's index (0, 1, ... over the entries that have keys): `pair_logit` pools the
      entries, one read being one instance, at most MAX_STRUCTURED keys in all; and, with
      `sensitive_scale` > 0, ``hf|tool|sensitive`` of that value when the file holds
      credentials by convention (known_names.py `sensitive_file`), the one key a secret
      the gate never saw shares with the trained ones; with `sensitive_places`, also
      ``hf|tool|sensitive|<place>`` of that value (known_names.py `path_place`: a
      project's ``.env`` is ``home-files``, ``~/.ssh/id_rsa`` ``home-dot``,
      ``/etc/shadow`` ``system``): a system key's read and a project secret's read share
      the plain mark, and where the policy counts only one of them the other's allows
      stepped the shared mark toward "allow" (docs/learning.md, "The sensitive mark's
      place").

    With `window` > 0 only the newest `window` entries of the history (oldest first) are
    read (`ModelConfig.wide_pair_history`): a read further back is not the history rule's.

    Why a product of the two (`pair_logit`) and not more crosses: the history rule is a
    conjunction (an outbound call AND a secret read earlier); the linear crosses must learn
    it separately for every (site, file) pair from a few examples each, while the call's
    own words soak up the label. The factors share what they learn: a file's factor is
    learned from every call site, a site's from every file (measured: docs/learning.md).
    Empty sides give an empty product (zero logit)."""
    tool, args = _parse_call(context)
    method = args.get("method")
    site = dict.fromkeys([f"p|{tool}"] + ([f"p|{tool}|{method}"] if isinstance(method, str)
                                          else []), 1.0)
    egress = egress_call(tool, args)
    if egress_scale > 0 and egress:
        site["p|egress"] = egress_scale
    dest = call_destination(args) if destination_scale > 0 and egress else None
    keys: list[tuple[str, int]] = []
    entries, secret_read = 0, False
    read = min(window, MAX_STRUCTURED) if window > 0 else MAX_STRUCTURED
    for entry in (history or [])[-read:]:
        e_tool, e_args = _parse_call(entry)
        path = e_args.get("path")
        if isinstance(path, str) and path and len(keys) < MAX_STRUCTURED:
            name = posixpath.basename(path.rstrip("/"))
            mine = dict.fromkeys([f"h|{e_tool}|{name}"]
                                 + [f"hw|{w}" for w in _NAME_WORD.findall(name)[:8]], 1.0)
            sensitive = (sensitive_scale > 0 or destination_rows > 0) and sensitive_file(path)
            secret_read = secret_read or sensitive
            if sensitive_scale > 0 and sensitive:
                mine[f"hf|{e_tool}|sensitive"] = sensitive_scale
                if sensitive_places:
                    place = path_place(path) or "none"
                    mine[f"hf|{e_tool}|sensitive|{place}"] = sensitive_scale
            keys += [(k, v, entries) for k, v in mine.items()][:MAX_STRUCTURED - len(keys)]
            entries += 1
    if destination_rows and not secret_read:
        dest = None  # the key speaks only where the history rule could
    c_idx = np.fromiter((_bucket(k, buckets) for k in site), np.int64, len(site))
    c_val = np.fromiter(site.values(), np.float64, len(site))
    c_val /= np.linalg.norm(c_val)
    if dest is not None:
        c_idx = np.append(c_idx, destination_row(dest, buckets, destination_rows))
        c_val = np.append(c_val, destination_scale)
    h_idx = np.fromiter((_bucket(k, buckets) for k, _, _ in keys), np.int64, len(keys))
    h_val = np.fromiter((v for _, v, _ in keys), np.float64, len(keys))
    h_grp = np.fromiter((e for _, _, e in keys), np.int64, len(keys))
    return c_idx, c_val, h_idx, h_val, h_grp
