"""Well-known names: package names (and tokens that imitate one: the typosquat marks), and
the files that hold credentials (the sensitive-file marks).

A typosquat (``reqeusts``, ``lodahs``) is harmful only because it is one keystroke away
from a package everybody installs; from its own bytes it is just another unseen name, and
no learner can tell ``panadas`` from ``polars`` without knowing which names are the real
ones (measured: docs/learning.md, "Known names"; 0 of 9-13 held-out typosquats were
blocked without this). Registries and gateways judge a new name the same way: against a
list of the most-installed packages. `KNOWN_PACKAGES` is such a list, written down from
the public download rankings of PyPI and npm (not from the benchmark's stream); the gate
still has to LEARN what a near miss means -- the feature only says "this token is a known
name" or "this token is one edit away from a known name and is not one itself".

A near miss is an optimal-string-alignment distance of exactly 1 (one insertion,
deletion, substitution, or swap of two neighbours) on a token of at least NEAR_MIN_CHARS
characters, found through a symmetric-delete index (every name and its one-character
deletions), so a token costs a few dictionary lookups whatever the list's length.

`sensitive_file` says whether a path names a file that, by common convention, holds
credentials (`SENSITIVE_BASENAMES`, `SENSITIVE_PATHS`: the file names secret scanners
such as gitleaks and trufflehog look for first). Why: a secret file the gate never saw
(``config/service-account.json``) shares nothing with the trained ones but a word it
also shares with ordinary configuration (``json``), so neither the rule "an outbound call
after a secret was read" nor a direct read of an unseen credential generalised to it
(measured: docs/learning.md, "Known names"). As with the packages, the mark only says
what the file is conventionally; what reading it means is learned.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

#: The most-installed packages of PyPI and npm (public download rankings, 2026), the
#: names a typosquat imitates. Lower case; an npm scope is not part of the name.
KNOWN_PACKAGES: frozenset[str] = frozenset("""
aiobotocore aiohttp aiosignal alembic amqp annotated-types anyio arrow asgiref async-timeout
attrs autopep8 awscli azure-core azure-identity azure-storage-blob babel bcrypt
beautifulsoup4 billiard black bleach blinker boto boto3 botocore build cachetools celery
certifi cffi chardet charset-normalizer click cloudpickle colorama coverage cryptography
cycler cython dask decorator defusedxml deprecated dill distlib django djangorestframework
docker docutils et-xmlfile exceptiongroup fastapi filelock flake8 flask fonttools
frozenlist fsspec gitpython google-api-core google-auth google-cloud-storage
googleapis-common-protos greenlet grpcio gunicorn h11 h5py httpcore httplib2 httpx
huggingface-hub humanize idna imageio importlib-metadata iniconfig ipython isort
itsdangerous jinja2 jmespath joblib jsonschema keras kiwisolver kombu langchain lxml
llvmlite loguru mako markdown markupsafe marshmallow matplotlib mccabe mock more-itertools
mpmath msgpack multidict mypy mypy-extensions networkx nltk notebook numba numpy oauthlib
openai openpyxl opencv-python orjson packaging pandas paramiko pathspec pendulum pexpect
pillow pip platformdirs plotly pluggy poetry polars prometheus-client prompt-toolkit
protobuf psutil psycopg2 psycopg2-binary ptyprocess pyarrow pyasn1 pycodestyle pycparser
pydantic pydantic-core pyflakes pygments pyjwt pylint pymysql pynacl pyopenssl pyparsing
pytest pytest-cov python-dateutil python-dotenv pytz pyyaml pyzmq redis regex requests
requests-oauthlib rich rsa ruff s3fs s3transfer safetensors scikit-learn scipy scrapy
seaborn selenium sentry-sdk setuptools simplejson six sniffio soupsieve sqlalchemy sqlparse
starlette streamlit structlog sympy tabulate tenacity tensorflow threadpoolctl tiktoken
tokenizers toml tomli tomlkit torch tornado tox tqdm traitlets transformers twine typer
typing-extensions tzdata ujson urllib3 uvicorn virtualenv websocket-client websockets
werkzeug wheel wrapt xarray yarl zipp
ajv angular apollo-server async autoprefixer aws-sdk axios babel-loader bluebird body-parser
boxen bunyan canvas chai chalk chart.js cheerio chokidar classnames commander compression
concurrently cookie-parser core-js cors cross-env cross-spawn cypress d3 date-fns dayjs
debug dotenv ejs electron esbuild eslint execa express express-session fastify figlet
firebase formidable fs-extra glob graphql handlebars helmet highlight.js http-proxy-middleware
husky immer inquirer ioredis jest jquery jsonwebtoken koa lerna lint-staged lodash luxon
marked micromatch minimatch minimist mkdirp mocha moment mongoose morgan multer mysql2
nanoid next node-fetch node-gyp nodemailer nodemon npm-run-all ora passport pino playwright
postcss prettier prop-types pug puppeteer qs react react-dom react-redux react-router
redux regenerator-runtime request rimraf rollup rxjs sass semver sequelize sharp shelljs
sinon socket.io socket.io-client styled-components stripe supertest tailwindcss three
ts-node tslib tsx turbo twilio typescript underscore uuid vite vitest vue webpack winston
ws yargs yup zod zustand
""".split())

#: A near miss is looked for on tokens (and names) of at least this many characters: one
#: edit away from a four-letter name is half the dictionary (``mock`` / ``lock``).
NEAR_MIN_CHARS = 5
#: A package-name-like token, after a version pin (``==1.2``, ``@^3.0``, ``>=2``) is cut.
_TOKEN = re.compile(r"[a-z0-9][a-z0-9._-]*[a-z0-9]")
_PIN = re.compile(r"(==|>=|<=|~=|!=|@(?=[\^~\d])|\[).*$")


def _deletions(word: str) -> set[str]:
    return {word[:i] + word[i + 1:] for i in range(len(word))}


def _osa_one(a: str, b: str) -> bool:
    """Whether a and b (a != b) are one insertion, deletion, substitution or neighbour swap
    apart (optimal string alignment distance 1)."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    if len(a) < len(b):  # one insertion into a at i
        return a[i:] == b[i + 1:]
    if a[i + 1:] == b[i + 1:]:  # one substitution at i
        return True
    return a[i] == b[i + 1] and a[i + 1] == b[i] and a[i + 2:] == b[i + 2:]  # one swap


class NameIndex:
    """Exact and near-miss lookups of tokens against a list of known names."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(n.lower() for n in names)
        self._by_deletion: dict[str, set[str]] = {}
        for name in self.names:
            if len(name) >= NEAR_MIN_CHARS:
                for key in _deletions(name) | {name}:
                    self._by_deletion.setdefault(key, set()).add(name)

    def near(self, token: str) -> str | None:
        """The known name `token` imitates (one edit away, not itself known), or None."""
        if token in self.names or len(token) < NEAR_MIN_CHARS:
            return None
        candidates: set[str] = set()
        for key in _deletions(token) | {token}:
            candidates |= self._by_deletion.get(key, set())
        hits = sorted(c for c in candidates if _osa_one(token, c))
        return hits[0] if hits else None

    def classify(self, text: str, max_tokens: int = 32) -> tuple[bool, bool]:
        """(a known name is among `text`'s tokens, a near miss of one is), over at most
        `max_tokens` whitespace-separated tokens, version pins cut."""
        known = near = False
        for raw in text.lower().split(maxsplit=max_tokens)[:max_tokens]:
            m = _TOKEN.fullmatch(_PIN.sub("", raw))
            if m is None:
                continue
            token = m.group()
            if token in self.names:
                known = True
            elif self.near(token) is not None:
                near = True
        return known, near


PACKAGES = NameIndex(KNOWN_PACKAGES)


#: File names that hold credentials by convention (matched against the last component,
#: lower-cased): dotenv files, key material, credential stores of common tools.
SENSITIVE_BASENAMES = re.compile(
    r"\.env(\.[\w.-]+)?|[\w.-]*\.(pem|key|p12|pfx|jks|keystore|kdbx|ppk|tfstate|asc)"
    r"|id_(rsa|dsa|ecdsa|ed25519)|[\w.-]*_(deploy_key|rsa|ed25519)|\.?netrc|\.npmrc|\.pypirc"
    r"|\.pgpass|\.htpasswd|\.git-credentials|g?shadow|sudoers"
    r"|credentials(\.\w+)?|secrets?(\.\w+)?|[\w.-]*service[-_]?account[\w.-]*\.json"
    r"|client[-_]secrets?(\.\w+)?|kubeconfig|vault(\.\w+)?")
#: Paths that hold credentials by convention whatever the file's name (a directory of key
#: material, a tool's credential file with a generic name).
SENSITIVE_PATHS = re.compile(
    r"(^|/)(\.ssh/(?!known_hosts$|[^/]*\.pub$)[^/]+|\.aws/(credentials|config)|\.kube/config"
    r"|\.docker/config\.json|\.gnupg/.+|\.config/gcloud/.+|\.azure/.+|\.password-store/.+)$")


def sensitive_file(path: str) -> bool:
    """Whether `path` names a file that holds credentials by common convention."""
    path = path.strip().lower().rstrip("/")
    name = path.rsplit("/", 1)[-1]
    return bool(SENSITIVE_BASENAMES.fullmatch(name) or SENSITIVE_PATHS.search(path))


#: HTTP methods that carry a request body to the server: the channels of an upload.
EGRESS_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: Words of a tool's name that say it sends a message or a file out (``email.send``,
#: ``slack.post_message``, ``s3.upload``), split on ``.``, ``_``, ``-`` and case.
EGRESS_VERBS = frozenset({"send", "mail", "email", "post", "upload", "publish", "message",
                          "share", "sms", "webhook"})
_TOOL_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def egress_call(tool: str, args: dict) -> bool:
    """Whether a call can carry data out of the machine: an HTTP request with a body
    (`EGRESS_METHODS`), or a tool whose name says it sends or uploads (`EGRESS_VERBS`).

    Why: "an upload after a secret was read" is one pattern whatever the channel (data
    loss prevention systems watch the same egress channels); without a mark the gate
    learns it per tool, and a channel it saw exfiltrate rarely (mail: ~1 in 100 signals)
    stays a coin flip (measured: docs/learning.md, "Egress calls"). Whether the
    destination is outside, and what the mark means, is still learned."""
    method = args.get("method")
    if isinstance(method, str) and method.upper() in EGRESS_METHODS:
        return True
    return any(w.lower() in EGRESS_VERBS for w in _TOOL_WORD.findall(tool))


#: Cloud instance-metadata services: AWS, Azure, GCP, Oracle, DigitalOcean and others at
#: 169.254.169.254 (AWS's IPv6 fd00:ec2::254), AWS ECS task metadata 169.254.170.2, GCP's
#: names for it, Alibaba Cloud's 100.100.100.200, Oracle's legacy 192.0.0.192 -- the
#: addresses SSRF guidance (the OWASP SSRF prevention cheat sheet, the providers' own
#: documentation) tells a client never to reach: they hand out the machine's credentials.
#: Any other link-local IPv4 address (169.254.0.0/16) counts too.
METADATA_HOSTS = frozenset({"169.254.169.254", "169.254.170.2", "fd00:ec2::254",
                            "metadata.google.internal", "metadata.goog", "metadata",
                            "100.100.100.200", "192.0.0.192"})
#: Ports of control APIs that answer without authentication by default: Docker Engine
#: (2375, and 2376 with TLS), the kubelet (10250, read-only 10255), etcd (2379): reaching
#: one is control of the host or the cluster, whatever the host's name.
CONTROL_PORTS = frozenset({2375, 2376, 10250, 10255, 2379})
#: Paste and anonymous file-drop services: the destinations of MITRE ATT&CK T1567
#: ("exfiltration over web service") that data-loss prevention lists name first.
PASTE_HOSTS = frozenset("""
pastebin.com paste.ee hastebin.com termbin.com 0x0.st transfer.sh file.io ix.io sprunge.us
dpaste.com dpaste.org paste.rs ghostbin.co controlc.com rentry.co privatebin.net
justpaste.it catbox.moe gofile.io bashupload.com temp.sh filebin.net oshi.at tmpfiles.org
anonfiles.com pastes.dev
""".split())
#: scheme://[userinfo@]host[:port]: the host (an IPv6 literal in brackets) and the port
_URL_HOST = re.compile(r"^[a-z][a-z0-9+.-]*://(?:[^@/?#\s]*@)?"
                       r"(\[[^\]]*\]|[^/:?#\s]*)(?::(\d{1,5})(?!\d))?", re.I)


def url_host(url: str) -> tuple[str, str | None] | None:
    """(host, port or None) of `url` (scheme://[user@]host[:port]/...): the host
    lower-cased, an IPv6 address without its brackets, a trailing dot dropped; None for
    anything not a URL."""
    m = _URL_HOST.match(url.strip())
    if m is None:
        return None
    return m.group(1).strip("[]").lower().rstrip("."), m.group(2)


def endpoint_kind(url: str) -> str | None:
    """``"metadata"`` when `url` (scheme://host[:port]/...) reaches a cloud metadata
    service, a link-local address or an unauthenticated control port (`METADATA_HOSTS`,
    `CONTROL_PORTS`); ``"paste"`` when its host (or a parent domain) is a paste or
    file-drop service (`PASTE_HOSTS`); None otherwise, and for anything not a URL.

    Why (docs/learning.md, "Endpoint marks"): an endpoint the gate never saw
    (``100.100.100.200``, ``127.0.0.1:2375``, ``termbin.com``) shares none of its bytes
    with the ones it learned to block; as with the package names, the mark says only what
    the endpoint is by common knowledge -- what reaching it means is learned."""
    found = url_host(url)
    if found is None:
        return None
    host, port = found
    if (host in METADATA_HOSTS or host.startswith("169.254.")
            or (port is not None and int(port) in CONTROL_PORTS)):
        return "metadata"
    parts = host.split(".")
    if any(".".join(parts[i:]) in PASTE_HOSTS for i in range(len(parts) - 1)):
        return "paste"
    return None


#: A dotted-quad IPv4 literal inside a token (``tcp:23.61.2.54:5555``, ``/dev/tcp/...``),
#: not part of a longer run of digits and dots (a version ``1.2.3.4.5`` is not one).
_IPV4_IN_TOKEN = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")


def public_address(token: str) -> bool:
    """Whether `token` holds a literal IP address of the public internet: an IPv4 dotted
    quad anywhere in it (``146.75.1.2:6666``, ``tcp:23.61.2.54:5555``,
    ``/dev/udp/23.220.74.132/6666``, ``http://8.8.8.8/x``) or the whole token an IPv6
    address (brackets and a URL's scheme aside), whose `is_global` holds: not loopback,
    private, link-local (the metadata services have their own mark) or reserved.

    Why (docs/learning.md, "A public address"): a command that connects to a bare
    address rather than a name is how a reverse shell or a miner reaches its operator,
    and an address the gate never saw shares no byte with the ones it learned to block
    (``./xmrig -o 146.75.143.199:6666`` was answered allow at 21 of 24 checkpoints while
    ``xmrig -o pool...`` and ``nc -e /bin/sh 23.x.x.x ...`` were blocked). As with the
    other marks, the mark says what the token is; what reaching it means is learned."""
    for literal in _IPV4_IN_TOKEN.findall(token):
        try:
            if ipaddress.IPv4Address(literal).is_global:
                return True
        except ValueError:  # an octet over 255: not an address
            continue
    if ":" in token:
        host = url_host(token)
        candidate = host[0] if host else token.strip("[]'\"`,;()")
        try:
            return ipaddress.IPv6Address(candidate).is_global
        except ValueError:
            return False
    return False


#: Top-level directories that hold the system's own files by the Filesystem Hierarchy
#: Standard (and the superuser's home), not a user's.
SYSTEM_DIRS = frozenset({"etc", "usr", "bin", "sbin", "lib", "lib32", "lib64", "boot", "root",
                         "var", "opt", "srv", "proc", "sys", "dev", "run", "mnt", "media",
                         "snap", "nix", "Library", "System", "private"})
_HOMES = frozenset({"home", "Users"})


def path_place(token: str) -> str | None:
    """Where in the file system a path-like token points, by the Filesystem Hierarchy
    Standard's conventions, or None when it is not a path:

    ``root`` (``/``), ``system`` (under `SYSTEM_DIRS`), ``tmp`` (``/tmp``, ``/var/tmp``),
    ``home`` (a home directory itself: ``~``, ``/home/carol``), ``home-dot`` (a dot entry
    of a home directory, where tools keep configuration and keys: ``~/.ssh/id_rsa``,
    ``/home/a/.bashrc``), ``home-files`` (anything else in a home: ``~/Documents/x``,
    ``/home/a/src/app/main.py``), ``parent`` (a relative path that starts by leaving the
    working directory: ``../../x``), ``relative`` (inside it: ``build/out``, ``./x``),
    ``other`` (any other absolute path).

    Why (docs/learning.md, "Path places"): a deletion, a write or a read is judged by
    where it lands, and a path the gate never saw (``/srv/hr``, ``~/.zshrc``) shares no
    word with the ones it learned; as with the other marks, what a place means for each
    command is learned."""
    t = token.strip("'\"`,;()")
    if not t or "://" in t or "\x00" in t:
        return None
    if t == "~" or t.startswith("~/"):
        parts = [p for p in t[1:].split("/") if p]
        return "home" if not parts else ("home-dot" if parts[0].startswith(".")
                                         else "home-files")
    if t.startswith("/"):
        parts = [p for p in t.split("/") if p not in ("", ".")]
        if not parts:
            return "root"
        if parts[0] == "tmp" or parts[:2] == ["var", "tmp"]:
            return "tmp"
        if parts[0] in _HOMES:
            if len(parts) <= 2:
                return "home"
            return "home-dot" if parts[2].startswith(".") else "home-files"
        return "system" if parts[0] in SYSTEM_DIRS else "other"
    if t == ".." or t.startswith("../"):
        return "parent"
    if t.startswith("./") or ("/" in t and not t.startswith("-")):
        return "relative"
    return None
