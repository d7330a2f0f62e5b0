"""Model configuration: the two presets of DESIGN.md section 1 and a stable fingerprint.

The fingerprint goes into every checkpoint so that weights trained for one shape are
never loaded silently into another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

#: Fields added after states were stored with the code before them, each with the value
#: that code behaved as: at that value the field does not enter `ModelConfig.fingerprint`
#: (a field that changes what the weights mean at its default is not listed: its states
#: need `gated run --reinit`, docs/operations.md).
FINGERPRINT_AS_BEFORE: dict[str, object] = {"wide_bias": 1.0, "wide_pair_history": 0}
#: Fields that say how the weights are read, not what they hold or their shape: never in
#: the fingerprint, so a state stored at another value (or before the field existed)
#: loads and is read the new way (`wide_familiarity`: each weight means what it meant;
#: only how much a call's unfamiliar n-grams say in a decision changes;
#: `wide_novel_destinations`: one more hashed key, ``d|novel``, read on calls to a domain
#: whose key is still 0; every other weight means what it meant, and the mark's bucket
#: starts from whatever a colliding key left there, as any hashed key does).
FINGERPRINT_IGNORES: frozenset[str] = frozenset({"wide_familiarity",
                                                 "wide_novel_destinations"})


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the encoder-decoder transformer (byte vocabulary, pre-LayerNorm)."""

    vocab_size: int = 260
    d_model: int = 256
    n_heads: int = 8
    d_ff: int = 1024
    n_enc_layers: int = 4
    n_dec_layers: int = 2
    max_seq_len: int = 256
    ln_eps: float = 1e-5
    # --- the source and the gate (docs/design.md section 1, revised; why: docs/learning.md)
    #: Version of the source encoding: 2 = current call first, then history newest-first,
    #: each entry abbreviated; segment embedding; gate pools call and history apart.
    #: 1 = the layout before 2026-11-23 (history SEP ... SEP call, the last max_seq_len
    #: bytes kept, one segment), kept only so the benchmark can show the ablation.
    source_format: int = 2
    #: History entries kept in the source (newest first), if they fit.
    max_history: int = 12
    #: Bytes an abbreviated history entry may take: the budget is what the current call
    #: leaves, shared among the entries, clamped to [min, max].
    history_entry_min: int = 12
    history_entry_max: int = 24
    #: The wide path: hashed byte n-grams (1..wide_ngram) of the call and of the history,
    #: one linear logit added to the gate's. 0 buckets = no wide path.
    wide_buckets: int = 1 << 18
    wide_ngram: int = 4
    #: z_wide = wide_scale * <w, x> with x L2-normalised per segment (plus a bias feature,
    #: `wide_bias`).
    #: The wide weights are trained by their own AdaGrad (engine/wide_learner.py), whose
    #: steps do not depend on this scale's size, so 1 keeps the weights in logit units.
    wide_scale: float = 1.0
    #: The history segment's n-gram values are multiplied by this (sweep in
    #: bench/anchor.py: 0.25 is best for a linear model; the transformer reads all of it).
    wide_history_scale: float = 0.25
    #: The value of the wide path's bias feature (bucket 0, in every source; 0 = none).
    #: Without it the first checkpoint's lead over the anchor rose in the harness and in the
    #: daemon, and block recall on unseen values fell at two checkpoints of 115: measured,
    #: not the default (docs/learning.md, "No bias in the wide path").
    wide_bias: float = 1.0
    #: Structured wide features (engine/wide.py `structured_features`; why: docs/learning.md):
    #: the words of each argument keyed by tool and argument, their total L2 norm this, ...
    wide_call_words: float = 0.3
    #: ... and one feature of this value per (call's tool and method) x (a history entry's
    #: tool and the last component of its `path`). 0 turns either off.
    wide_history_cross: float = 0.3
    #: ... and the shapes of the arguments' values and of their tokens (letters -> ``a``,
    #: digits -> ``0``), their total L2 norm this: what an unseen value shares with the
    #: learned ones (docs/learning.md, "Argument shapes").
    wide_call_shapes: float = 1.0
    #: ... with a URL's host name written ``h`` in them, whatever its labels (False: folded
    #: like any value, ``docs.python.org`` -> ``a.a.a``): a name's label count taught the
    #: gate that the allow-listed hosts' form is safe (docs/learning.md, "A host's name in
    #: a shape").
    wide_shape_hosts: bool = True
    #: ... and, per argument, whether it names a well-known package or a token one edit
    #: away from one (engine/known_names.py: what a typosquat of a package the gate never
    #: saw has in common with the learned ones), their total L2 norm this (0 = none;
    #: docs/learning.md, "Known names").
    wide_known_names: float = 1.0
    #: ... and, per argument, a mark of this value when it names a file that holds
    #: credentials by convention (engine/known_names.py `sensitive_file`), and a key of this
    #: value for such a file in the pair term's history (0 = none; louder is learned
    #: sooner: 2.0 in docs/learning.md, "Egress calls", 4.0 since "The sensitive-file marks
    #: at 4", where 2 / 3 / 4 / 6 / 8 were swept on six seeds).
    wide_sensitive_files: float = 4.0
    #: ... and, on the pair term's history side, that key again with the file's place
    #: (engine/known_names.py `path_place`: a project's ``.env``, ``~/.ssh/id_rsa``,
    #: ``/etc/shadow``): a policy that counts a project secret's read but not a system
    #: key's is learned without the two sharing one key (False: the plain key only;
    #: docs/learning.md, "The sensitive mark's place").
    wide_sensitive_places: bool = True
    #: ... and the call's own mark again with the file's place: a project's secret is read
    #: freely, a system's or a home's credential file is not, and the plain mark, shared
    #: by both, told an unseen one neither (False: the plain mark only; docs/learning.md,
    #: "Seed 4's dip at ~1,500: the call's sensitive mark with its place, ...").
    wide_sensitive_call_places: bool = True
    #: ... and a mark of this value when an argument's URL reaches a cloud metadata
    #: service or an unauthenticated control port, or a paste / file-drop host
    #: (engine/known_names.py `endpoint_kind`), the kind alone and keyed by tool and HTTP
    #: method (0 = none; docs/learning.md, "Endpoint marks").
    wide_endpoints: float = 2.0
    #: ... and the kind ``address`` among those marks when a token holds a public IP
    #: address (engine/known_names.py `public_address`), whatever the tool: a reverse shell
    #: or a miner reaching a bare address the gate never saw shared no byte with the ones
    #: it learned (False: URLs' kinds only; docs/learning.md, "A public address").
    wide_endpoint_addresses: bool = True
    #: ... and, per SQL statement of an argument, its verb and whether a WHERE clause
    #: limits it (engine/sql_statements.py), their total L2 norm this (0 = none;
    #: docs/learning.md, "SQL statements").
    wide_sql_statements: float = 1.0
    #: ... and, per path-like token of an argument, where it points (engine/known_names.py
    #: `path_place`: system, home-dot, parent, tmp, ...), alone and with the argument's
    #: first word, their total L2 norm this (0 = none; docs/learning.md, "Path places").
    wide_path_places: float = 0.5
    #: ... and a key of this value for the domain a call reaches or sends to (engine/wide.py
    #: `call_destination`), whatever its tool or method: an allow list works by domain
    #: (0 = none; docs/learning.md, "A domain key").
    wide_call_domains: float = 0.3
    #: ... and, after that key, a key ``d|novel`` of this value on a call whose domain
    #: the reading member has not learned yet (its domain key's weight still 0;
    #: engine/wide_logit.py `novel_values`): under an allow list, a destination never
    #: seen is what an unseen outside host shares with the blocked ones the stream showed,
    #: while its own domain key says nothing (0 = none; 1, the default since 2026-11-30:
    #: docs/learning.md, "A first-seen destination", "New hosts in the stream, ...", "The
    #: first-seen mark made the default"). Needs the domain key.
    wide_novel_destinations: float = 1.0
    #: ... and a key of this value on the pair term's call side when the call can carry
    #: data out (engine/known_names.py `egress_call`: an HTTP body, mail, an upload), so
    #: the channels share what they learn about the history (0 = none; docs/learning.md).
    wide_egress_calls: float = 1.0
    #: ... and, on such a call, a key for where it sends to (engine/wide.py
    #: `call_destination`: the last two labels of the mail domain or the URL's host) of
    #: this value, added after the site's L2 normalisation: the org's own hosts learn a
    #: factor that silences the history rule for them, while a destination never seen
    #: adds only its small initial factor (0 = none; docs/learning.md, "A destination on
    #: the pair term"; 1.0 with the rows below: "The destination's own rows").
    wide_pair_destination: float = 1.0
    #: ... the destination keys' own rows: this share of `wide_pair_buckets` more rows
    #: after the call side's table (`pair_destination_rows`). They start at zero and learn only
    #: "allow" -- a first look's "block" leaves them as they are, a correction's or a
    #: second look's steps them -- and a call gets its destination key only after a
    #: credential-file read in its history (known_names.py `sensitive_file`): the key
    #: says "not the history rule, here" (the org's own hosts) and nothing else.
    #: Stepped on blocks, outside hosts' rows took a share of every exfiltration (block
    #: recall on unseen values fell); on every upload, the org's row also took the allows
    #: after ordinary reads, which teach the site what a harmless read is (the history
    #: probes' allow twins fell). 0 = the key hashed among the site's keys, random, both
    #: labels, every upload (docs/learning.md, "The destination's own rows").
    wide_pair_destination_share: float = 1 / 16
    #: The call x history pair term (engine/wide_pair.py `pair_features`, engine/wide.py
    #: `pair_logit`): rank of its two factor tables, each [wide_pair_buckets, rank].
    #: 0 (or no wide path) = none.
    wide_pair_rank: int = 8
    wide_pair_buckets: int = 1 << 14
    #: Standard deviation of the call side's initial factors (the history side starts at
    #: zero, so the term starts silent and is not noise on the first signals). 0.3 was
    #: tried with a slower wide path and not kept (docs/learning.md, "The wide path's rate").
    wide_pair_init: float = 0.1
    #: ... but the first of them is this same value for every call: a history the gate has
    #: learned to suspect is suspect for every call until the call side learns otherwise,
    #: whatever the seed (False: all random; docs/learning.md, "The pair term's shared
    #: factor").
    wide_pair_init_shared: bool = True
    #: How the pair term pools the history (engine/wide_logit.py `pair_logit`): 0 = the sum of
    #: its keys, tau > 0 = a soft minimum over its entries at temperature tau (logit
    #: units), so one incriminating read carries the term and the session's other files
    #: are not blamed with it.
    wide_pair_pool: float = 0.5
    #: The pair term reads only the newest this many history entries (0 = every entry the
    #: call came with): how far back a history rule looks, the window the policy names --
    #: the learning issue's "a secret read 10 calls earlier", the realistic stream's rule
    #: (gated/traffic `SECRET_WINDOW`): knowledge of the policy, given, not learned. Read
    #: further back, a secret 11 or 12 calls before a rightful upload (TRUE allow) taught
    #: the term "allow" for the secret's keys, one full step at each second look, against
    #: the uploads it blocks (docs/learning.md, "The pair term's window"). The transformer
    #: and the linear features still read every entry the source holds (`max_history`):
    #: a policy that looks further back is learned there, more slowly.
    wide_pair_history: int = 10
    #: How the pair term joins the linear logit (engine/wide_logit.py `veto_combine`): 0 = added;
    #: c > 0 = the history as a veto, sigmoid(z) = sigmoid(linear) sigmoid(c + pair), c
    #: being how sure an unremarkable history is of "allow" (docs/learning.md, "The
    #: history as a veto").
    wide_pair_veto: float = 0.0
    #: The pair term speaks only for "block" (engine/wide_logit.py `veto_combine`): the history
    #: term is log(2 sigmoid(pair)), 0 for an unremarkable history, at most log 2 for one
    #: the gate has seen only in allowed sessions, and the pair itself when it says
    #: "block". A session's earlier calls make a call suspicious; they do not vouch for it
    #: (docs/learning.md, "The history speaks only for block"). False: the raw pair term.
    wide_pair_block_only: bool = True
    #: The wide path as an online bag of this many learners (Oza and Russell's online
    #: bagging): the first learns every signal at its weight, each of the others at k
    #: times it, k drawn from Poisson(1) per learner and signal (0: it skips the signal);
    #: the wide logit is the mean of their logits. Why (docs/learning.md, "The wide path
    #: as a bag"): one learner's verdict on a whole category swung with single steps (a
    #: weight-4 correction of one rightful e-mail), and such swings were what put the
    #: history rule, block recall on unseen values and the lead over the anchor under
    #: their targets in mid-stream; a bag averages them down without an average's lag.
    #: Each member has its own wide tables (the flat buffer grows by that much): 4, not
    #: the 8 that learned a little better in the harness, because flint's 8-member
    #: snapshot (38.6 MB) took up to 1.18 s to reach a cluster's edges (goal 1 s); 4: 30 MB.
    wide_members: int = 4
    #: The byte n-grams' part of each member's linear logit is read scaled by f ** this,
    #: f the share of the source's n-gram mass (sum of val^2) on buckets the member has
    #: learned (weight not 0): a call made of n-grams the path never stepped leans on its
    #: shapes, places and known names, which an unseen value shares with the calls it
    #: learned, instead of on the few n-grams it happens to share with the rare blocks.
    #: Learning is unchanged (the wide learner steps on the n-grams as read unscaled);
    #: the gradient through the model's forward is exact with f held constant, which it
    #: is wherever it is differentiable (it moves only when a weight leaves 0).
    #: 8: in the harness 1, 2 and 4 removed fewer of the first checkpoint's misses and 16
    #: cost lead; in the daemon, beside the defaults on five seeds, unseen-value probes met
    #: 0.90 at 44 of 45 checkpoints against 39, the other probes as often. 0 = off
    #: (docs/learning.md, "A familiarity-scaled n-gram part").
    wide_familiarity: float = 8.0

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "heads are contiguous slices of d_model"
            )
        if self.d_model % 2 != 0:
            raise ValueError(f"d_model={self.d_model} must be even for the sinusoidal encoding")
        for name in ("vocab_size", "d_ff", "n_enc_layers", "n_dec_layers", "max_seq_len",
                     "wide_ngram", "history_entry_min"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("wide_buckets", "max_history", "wide_history_scale", "wide_bias",
                     "wide_call_words",
                     "wide_history_cross", "wide_call_shapes", "wide_known_names",
                     "wide_sensitive_files", "wide_endpoints", "wide_sql_statements",
                     "wide_path_places", "wide_call_domains", "wide_egress_calls",
                     "wide_pair_destination", "wide_pair_rank",
                     "wide_pair_buckets", "wide_pair_init", "wide_pair_pool", "wide_pair_veto",
                     "wide_pair_history", "wide_familiarity", "wide_novel_destinations"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.wide_novel_destinations and not self.wide_call_domains:
            raise ValueError("wide_novel_destinations needs wide_call_domains > 0: a "
                             "destination counts as learned by its domain key's weight")
        if self.wide_members < 1:
            raise ValueError(f"wide_members must be >= 1, got {self.wide_members}")
        if self.wide_pair_rank and self.wide_pair_buckets < 2:
            raise ValueError("the pair term (wide_pair_rank > 0) needs wide_pair_buckets >= 2")
        if not 0.0 <= self.wide_pair_destination_share <= 1.0:
            raise ValueError("wide_pair_destination_share must be in [0, 1], got "
                             f"{self.wide_pair_destination_share}")
        if self.history_entry_max < self.history_entry_min:
            raise ValueError("history_entry_max must be >= history_entry_min")
        if self.source_format not in (1, 2):
            raise ValueError(f"source_format {self.source_format} is not supported; this "
                             "engine reads format 2 (and 1 for ablations; docs/design.md)")

    @property
    def pair_destination_rows(self) -> int:
        """How many rows the call side's table has for the destination keys, after its
        `wide_pair_buckets` (`wide_pair_destination_share` of those, rounded down; 0
        without a pair term)."""
        if not self.wide_pair_rank:
            return 0
        return int(self.wide_pair_buckets * self.wide_pair_destination_share)

    @property
    def pair_call_rows(self) -> int:
        """Rows of one member's call-side pair table: its buckets and destination rows."""
        return self.wide_pair_buckets + self.pair_destination_rows

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def tiny(cls) -> ModelConfig:
        """The small shape the tests train in seconds (its wide path one learner: the bag's
        tests ask for members where they test it)."""
        return cls(d_model=32, n_heads=4, d_ff=64, n_enc_layers=2, n_dec_layers=2, max_seq_len=32,
                   max_history=4, history_entry_min=4, history_entry_max=12,
                   wide_buckets=1 << 12, wide_pair_rank=4, wide_pair_buckets=1 << 10,
                   wide_members=1)

    @classmethod
    def flint(cls) -> ModelConfig:
        """The gateway's FLINT shape (256-d, 8 heads): the default."""
        return cls()

    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        presets = {"tiny": cls.tiny, "flint": cls.flint}
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(presets)}")
        return presets[name]()

    def to_dict(self) -> dict:
        return asdict(self)

    def fingerprint(self) -> str:
        """A stable hash of every field: equal shapes give equal fingerprints. A field in
        `FINGERPRINT_AS_BEFORE` is left out while it holds the value the code had before
        the field existed, so a state stored by that code still fits; one in
        `FINGERPRINT_IGNORES` always."""
        fields = {k: v for k, v in self.to_dict().items() if k not in FINGERPRINT_IGNORES
                  and (k not in FINGERPRINT_AS_BEFORE or FINGERPRINT_AS_BEFORE[k] != v)}
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=12).hexdigest()
