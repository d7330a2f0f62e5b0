"""The stream: interleaved agent sessions, their calls drawn from the pools' halves, a noisy
gate with late corrections, a policy change, and the held-out probes (`GatewayTraffic`)."""

from __future__ import annotations

import heapq
import json
import posixpath
import random
import re
from dataclasses import dataclass, field

from .policy import CATEGORY_REASON, TOOL_REASON, classify, outbound, parse_call
from .pools import ORG_DOMAIN, POOLS, SECRET_WINDOW


def call(tool: str, **args: object) -> str:
    """An MCP-style call string: the tool name, a space, the arguments as compact JSON."""
    return f"{tool} {json.dumps(args, separators=(', ', ': '))}"


@dataclass
class _Session:
    user: str
    ws: str
    length: int
    integration: bool  # an integration task: reads a secret, then talks to outside services
    secret: bool = False  # read a project secret already
    calls: list[str] = field(default_factory=list)
    last: str = ""


#: the pools of outside hosts the HTTP calls and the browsing reach (`GatewayTraffic`'s
#: `fresh_hosts` replaces a share of their draws by hosts never named before)
HOST_POOLS = ("api", "docs")


def fresh_host(rng: random.Random, pool: str) -> str:
    """A host no pool names and no earlier draw is likely to have named: a made-up
    three-syllable name under a common top-level domain (``api.zorvik.io``), with the
    pool's kind of first label. Never an allow-listed or org domain (their names are not
    consonant-vowel syllables: ``acme``, ``github``, ``python``, ``mozilla``)."""
    name = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3))
    first = "api" if pool == "api" else rng.choice(("docs", "learn", "dev"))
    return f"{first}.{name}.{rng.choice(('io', 'dev', 'app', 'net', 'co'))}"


class _Values:
    """Draws pool values from one half (train or held-out) and fills templates; with
    `fresh` > 0 that share of the outside hosts' draws names a host never seen (`fresh_host`)."""

    def __init__(self, rng: random.Random, held: bool) -> None:
        self.rng, self.held = rng, held
        self.fresh = 0.0  # `GatewayTraffic.fresh_hosts` sets the stream's

    def pick(self, name: str) -> str:
        if self.fresh and name in HOST_POOLS and self.rng.random() < self.fresh:
            return fresh_host(self.rng, name)  # (no draw at all while `fresh` is 0)
        return self.rng.choice(POOLS[name][self.held])

    def fill(self, template: str, s: _Session) -> str:
        def sub(m: re.Match[str]) -> str:
            k = m.group(1)
            if k in ("ws", "user"):
                return getattr(s, k)
            if k == "home":
                return f"/home/{s.user}"
            if k == "n":
                return str(self.rng.randint(2, 999))
            if k == "who":
                return self.pick("user")
            if k == "hex":
                return f"{self.rng.getrandbits(28):07x}"
            if k == "ip":
                return self.pick("oct") + "".join(f".{self.rng.randint(1, 254)}" for _ in "abc")
            return self.fill(self.pick(k), s)
        return re.sub(r"\{(\w+)\}", sub, template)

    def f(self, name: str, s: _Session) -> str:
        """A filled value of pool `name` (underscores in flag pools stand for spaces)."""
        v = self.fill(self.pick(name), s)
        return v.replace("_", " ") if name in ("fetch", "rmflag") else v

    def file(self, s: _Session) -> str:
        return f"{s.ws}/{self.pick('dir')}/{self.pick('stem')}.{self.pick('ext')}"

    def ext_url(self, s: _Session) -> str:
        return f"https://{self.pick('api')}/{self.pick('res')}/{self.rng.randint(2, 99999)}"

    def email(self, s: _Session, external: bool) -> str:
        return f"{self.pick('user')}@{self.pick('edom') if external else ORG_DOMAIN}"

    def pkg(self, s: _Session, squat: bool) -> str:
        py = self.rng.random() < 0.6
        name = self.pick(("py" if py else "js") + ("squat" if squat else "name"))
        a, b, c = (self.rng.randint(0, 30) for _ in "abc")
        if self.rng.random() < 0.95:  # a pinned version, as agents often write it
            name += f"=={a % 10}.{b}.{c % 10}" if py else f"@^{a + 1}.{c % 10}.0"
        return call("pkg.install", manager=self.pick("pyman" if py else "jsman"), name=name)


def _push(v: _Values, s: _Session, branch: str, force: bool) -> str:
    remote = v.pick("remote") if v.rng.random() < 0.1 else \
        f"git@{v.pick('git')}:{s.user}/{posixpath.basename(s.ws)}.git"
    return call("git.push", remote=remote, branch=branch, **({"force": True} if force else {}))


def _metadata(v: _Values, s: _Session) -> str:
    url = f"http://{v.pick('meta')}/{v.f('metapath', s)}"
    if v.rng.random() < 0.7:
        return call("http.request", method="GET", url=url)
    return call("browser.open", url=url)


def _pipe_to_shell(v: _Values, s: _Session) -> str:
    url = f"https://{v.f('scripthost', s)}/{v.pick('stem')}/install.sh"
    return call("shell.exec", cmd=f"{v.f('fetch', s)} {url} | {v.pick('sh')}")


def _branch(v: _Values) -> str:
    kind = v.rng.choice(("feature", "fix", "chore"))
    return f"{kind}/{v.pick('feature')}-{v.rng.randint(2, 999)}"


#: kind -> builder. Kinds named after a block category build that category's calls.
KINDS = {
    "read_code": lambda v, s: call("fs.read", path=v.file(s)),
    "read_doc": lambda v, s: call("fs.read", path=f"{s.ws}/{v.pick('doc')}"),
    "read_secret": lambda v, s: call("fs.read", path=f"{s.ws}/{v.pick('secret')}"),
    "read_conf": lambda v, s: call("fs.read", path=f"{s.ws}/{v.pick('conf')}"),
    "read_sys": lambda v, s: call("fs.read", path=v.f("sysread", s)),
    "list": lambda v, s: call("fs.list", path=f"{s.ws}/{v.pick('dir')}/{v.pick('stem')}"),
    "write_code": lambda v, s: call("fs.write", path=v.file(s), content=v.f("content", s)),
    "write_tmp": lambda v, s: call("fs.write", path=f"/tmp/{v.pick('stem')}-{v.rng.randint(2, 999)}"
                                   ".log", content=v.f("content", s)),
    "shell_ok": lambda v, s: call("shell.exec", cmd=v.f("shell_ok", s)),
    "commit": lambda v, s: call("git.commit", message=v.f("msg", s)),
    "push": lambda v, s: (_push(v, s, _branch(v), v.rng.random() < 0.3) if v.rng.random() < 0.7
                          else _push(v, s, v.rng.choice(("main", "master")), False)),
    "http_get_ext": lambda v, s: call("http.request", method="GET", url=v.ext_url(s)),
    "http_org": lambda v, s: call("http.request", method=v.rng.choice(("GET", "POST")),
                                  url=f"https://{v.pick('svc')}.{ORG_DOMAIN}/{v.pick('res')}"
                                  f"/{v.rng.randint(2, 9999)}"),
    "http_post_ext": lambda v, s: call("http.request", method=v.rng.choice(("POST", "POST", "PUT")),
                                       url=v.ext_url(s), body=v.f("body", s)),
    "http_local": lambda v, s: call("http.request", method="GET", url=f"http://{v.pick('local')}"
                                    f"/{v.pick('res')}/{v.rng.randint(2, 999)}"),
    "browse_ext": lambda v, s: call("browser.open", url=f"https://{v.pick('docs')}/"
                                    f"{v.pick('topic')}#{v.rng.randint(2, 999)}"),
    "browse_org": lambda v, s: call("browser.open", url=f"https://{v.pick('svc')}.{ORG_DOMAIN}/"
                                    f"{v.pick('feature')}/{v.rng.randint(2, 999)}"),
    "db_ok": lambda v, s: call("db.query", sql=v.f("sql_ok", s)),
    "email_org": lambda v, s: call("email.send", to=v.email(s, False), subject=v.f("subject", s)),
    "email_ext": lambda v, s: call("email.send", to=v.email(s, True), subject=v.f("subject", s)),
    "pkg_ok": lambda v, s: v.pkg(s, False),
    # the static block categories
    "rm_outside": lambda v, s: call("shell.exec", cmd=f"rm {v.f('rmflag', s)} {v.f('rmout', s)}"),
    "pipe_to_shell": _pipe_to_shell,
    "privilege": lambda v, s: call("shell.exec", cmd=v.f("priv", s)),
    "reverse_shell": lambda v, s: call("shell.exec", cmd=v.f("rev", s)),
    "write_outside": lambda v, s: call("fs.write", path=v.f("wout", s), content=v.f("content", s)),
    "credential_read": lambda v, s: call("fs.read", path=v.f("creds", s)),
    "metadata": _metadata,
    "force_push_main": lambda v, s: _push(v, s, v.rng.choice(("main", "master")), True),
    "db_destructive": lambda v, s: call("db.query", sql=v.f("sql_bad", s)),
    "typosquat": lambda v, s: v.pkg(s, True),
    "paste_upload": lambda v, s: call("http.request", method=v.rng.choice(("POST", "PUT")),
                                      url=f"https://{v.pick('paste')}/{v.rng.randint(2, 99999)}",
                                      body=v.f("body", s)),
}

#: how often each kind is drawn at an ordinary step (before session-state boosts)
WEIGHTS = {
    "read_code": 14, "read_doc": 4, "read_secret": 1.5, "read_conf": 2, "read_sys": 0.8, "list": 6,
    "write_code": 9, "write_tmp": 1, "shell_ok": 13, "commit": 4, "push": 3,
    "http_get_ext": 12, "http_org": 4, "http_post_ext": 2, "http_local": 1.5, "browse_ext": 9,
    "browse_org": 1, "db_ok": 5, "email_org": 1.5, "email_ext": 1, "pkg_ok": 6,
    "rm_outside": 1.45, "pipe_to_shell": 1.45, "privilege": 1.45, "reverse_shell": 1.45,
    "write_outside": 1.45, "credential_read": 1.45, "metadata": 1.45, "force_push_main": 1.45,
    "db_destructive": 1.45, "typosquat": 1.45, "paste_upload": 1.45,
}
#: plausible sequences: what the previous kind makes likelier next
FOLLOW = {
    "list": {"read_code": 8, "read_doc": 2}, "read_code": {"write_code": 6},
    "write_code": {"shell_ok": 8, "write_code": 3}, "shell_ok": {"commit": 3},
    "commit": {"push": 6}, "read_secret": {"http_post_ext": 6, "email_ext": 2, "db_ok": 3},
    "read_conf": {"http_post_ext": 3, "email_ext": 1},
    "pkg_ok": {"shell_ok": 4}, "browse_ext": {"write_code": 3},
}


@dataclass
class Event:
    """One signal of the stream (or one probe) with what the policy really says about it."""

    signal: dict  # the DESIGN signal map: id, context, history, decision, [feedback], reason, ts
    true_allow: bool  # TRUE label under the policy in force when emitted
    category: str  # "allow" or the block category (`CATEGORY_REASON` keys)
    history_case: bool  # an outbound POST/PUT or mail that rule 12 concerns, blocked or not
    is_correction: bool
    policy: str
    workspace: str = ""  # the session's workspace, so the call can be relabelled (`classify`)


def _new_session(v: _Values, integration_share: float = 0.45, p_end: float = 0.19) -> _Session:
    """A session in a fresh workspace; its length is geometric (mean ~1/p_end), capped at 30."""
    user = v.pick("user")
    n = 1
    while n < 30 and v.rng.random() > p_end:
        n += 1
    return _Session(user, f"/home/{user}/src/{v.pick('pa')}-{v.pick('pb')}", n,
                    v.rng.random() < integration_share)


def _step(v: _Values, s: _Session, kinds: dict[str, float] = WEIGHTS) -> str:
    """The session's next call: a kind drawn by weight, boosted by the session's state."""
    w = dict(kinds)
    for k, b in FOLLOW.get(s.last, {}).items():
        if k in w:
            w[k] += b
    if not s.calls:
        w["list"] += 10
        w["read_code"] += 6
    if s.integration and "read_secret" in w:
        if not s.secret:
            w["read_secret"] += 10
        else:
            w["http_post_ext"] += 30
            w["email_ext"] += 10
    kind = v.rng.choices(list(w), weights=list(w.values()))[0]
    ctx = KINDS[kind](v, s)
    s.calls.append(ctx)
    s.last, s.secret = kind, s.secret or kind == "read_secret"
    return ctx


class GatewayTraffic:
    """A seeded, deterministic stream of gate signals with TRUE labels (see module doc).

    Calls come from one RNG and the gate's noise from another, so the calls of a stream do
    not depend on `gate_error_rate`, and `policy` (settable at any time) changes only the
    labels. A correction re-sends a mistaken signal's context and history with the gate's
    own (wrong) decision and reason plus ``false_positive`` / ``false_negative``; when the
    policy changed meanwhile and the decision is no longer wrong, it is not sent.

    `fresh_hosts` (settable at any time, like `policy`): the share of the outside hosts'
    draws (the HTTP calls' and the browsing's, `HOST_POOLS`) that name a host never seen
    before (`fresh_host`), as real traffic keeps reaching new services. 0, the default,
    draws exactly the stream it always drew. The probes are not touched: theirs are the
    held-out values already.
    """

    def __init__(self, seed: int = 0, *, gate_error_rate: float = 0.06,
                 correction_rate: float = 0.8, sessions: int = 8, max_history: int = 12,
                 confirm_rate: float = 0.03, fresh_hosts: float = 0.0) -> None:
        self.seed, self.policy = seed, "v1"
        self.gate_error_rate, self.correction_rate = gate_error_rate, correction_rate
        self.confirm_rate, self.max_history = confirm_rate, max_history
        self._rng = random.Random(seed)
        self._noise = random.Random(f"noise-{seed}")
        self._v = _Values(self._rng, held=False)
        self.fresh_hosts = fresh_hosts  # checked by the setter
        self._sessions = [_new_session(self._v) for _ in range(sessions)]
        self._due: list[tuple[int, int, dict]] = []  # (due index, index, pending correction)
        self._i = 0
        self._ts = 1_700_000_000.0

    @property
    def fresh_hosts(self) -> float:
        return self._v.fresh

    @fresh_hosts.setter
    def fresh_hosts(self, share: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"fresh_hosts is a share in [0, 1], got {share}")
        self._v.fresh = share

    def _signal(self, ctx: str, hist: list[str], decision: str, reason: str) -> dict:
        self._ts += round(self._noise.expovariate(2.0), 3)
        return {"id": f"gw{self.seed}-{self._i}", "context": ctx, "history": list(hist),
                "decision": decision, "reason": reason, "ts": round(self._ts, 3)}

    def next(self) -> Event:
        """The next event: a due correction if there is one, else a session's next call."""
        while self._due and self._due[0][0] <= self._i:
            ev = self._correction(heapq.heappop(self._due)[2])
            if ev is not None:
                self._i += 1
                return ev
        k = self._rng.randrange(len(self._sessions))
        s = self._sessions[k]
        hist = s.calls[-self.max_history:]
        ctx = _step(self._v, s)
        if len(s.calls) >= s.length:
            self._sessions[k] = _new_session(self._v)
        cat = classify(ctx, hist, self.policy, s.ws)
        tool = ctx.split(" ", 1)[0]
        truth = cat == "allow"
        wrong = self._noise.random() < self.gate_error_rate
        allow = truth != wrong
        reason = TOOL_REASON[tool][0] if allow else (TOOL_REASON[tool][1] if wrong
                                                     else CATEGORY_REASON[cat])
        sig = self._signal(ctx, hist, "allow" if allow else "block", reason)
        if wrong and self._noise.random() < self.correction_rate:
            due = self._i + self._noise.randint(5, 48)
            heapq.heappush(self._due, (due, self._i, dict(sig, workspace=s.ws)))
        elif not wrong and self._noise.random() < self.confirm_rate:
            sig["feedback"] = "confirm"
        self._i += 1
        return Event(sig, truth, cat, outbound(*parse_call(ctx)), False, self.policy, s.ws)

    def _correction(self, orig: dict) -> Event | None:
        cat = classify(orig["context"], orig["history"], self.policy, orig["workspace"])
        if (orig["decision"] == "allow") == (cat == "allow"):
            return None  # the policy changed under it: the gate's decision is now right
        sig = self._signal(orig["context"], orig["history"], orig["decision"], orig["reason"])
        sig["feedback"] = "false_positive" if orig["decision"] == "block" else "false_negative"
        return Event(sig, cat == "allow", cat, outbound(*parse_call(orig["context"])), True,
                     self.policy, orig["workspace"])

    def _truth(self, ctx: str, hist: list[str], ws: str, sid: str) -> Event:
        cat = classify(ctx, hist, self.policy, ws)
        reason = TOOL_REASON[ctx.split(" ", 1)[0]][0] if cat == "allow" else CATEGORY_REASON[cat]
        sig = {"id": sid, "context": ctx, "history": list(hist),
               "decision": "allow" if cat == "allow" else "block", "reason": reason}
        return Event(sig, cat == "allow", cat, outbound(*parse_call(ctx)), False, self.policy, ws)

    def probes(self, n: int, seed: int) -> list[Event]:
        """`n` noise-free calls built only from HELD-OUT values, with their sessions' history,
        TRUE-labelled under the current policy: generalisation to values never streamed."""
        v = _Values(random.Random(seed), held=True)
        out: list[Event] = []
        while len(out) < n:
            s = _new_session(v)
            while len(s.calls) < s.length and len(out) < n:
                hist = s.calls[-self.max_history:]
                out.append(self._truth(_step(v, s), hist, s.ws, f"probe{seed}-{len(out)}"))
        return out

    def history_probes(self, n: int, seed: int) -> list[Event]:
        """`n` rule-12 cases in pairs: an outbound call with a project-secret read 1-10 calls
        back (TRUE block), then the same call and history with that read swapped for a
        non-secret config read (TRUE allow). Under v2 external HTTP is blocked anyway, so
        the outbound call is then always e-mail. Train-pool values: this measures the rule,
        the held-out `probes` measure unseen values."""
        v = _Values(random.Random(seed), held=False)
        benign = {k: WEIGHTS[k] for k in ("read_code", "read_doc", "list", "write_code",
                                          "shell_ok", "commit", "db_ok", "browse_org")}
        out: list[Event] = []
        while len(out) < n:
            s = _new_session(v, integration_share=0.0)
            back = v.rng.randint(1, SECRET_WINDOW)
            before = [_step(v, s, benign) for _ in range(v.rng.randint(0, 2))]
            secret = KINDS["read_secret"](v, s)
            after = [_step(v, s, benign) for _ in range(back - 1)]
            ext = "email_ext" if self.policy == "v2" or v.rng.random() < 0.4 else "http_post_ext"
            ctx = KINDS[ext](v, s)
            twin = call("fs.read", path=f"{s.ws}/{v.pick('conf')}")
            for i, read in enumerate((secret, twin)):
                hist = (before + [read] + after)[-self.max_history:]
                out.append(self._truth(ctx, hist, s.ws, f"hprobe{seed}-{len(out)}-{i}"))
        return out[:n]
