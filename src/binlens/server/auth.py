"""The security layer of `binlens serve` (SPEC §5): Origin/Host, query-string tokens, bearer auth, log redaction.

`SecurityMiddleware` wraps the whole ASGI app, so every HTTP route and every WebSocket handshake
passes the same checks, in this order:

1. `Origin` present and neither loopback, the configured host nor an `--allow-origin` -> 403;
   on a loopback listener, a `Host` header naming anything but a loopback name -> 403
   (DNS rebinding: a browser page on evil.example resolving to 127.0.0.1).
2. A token in the query string (a token-like parameter name, or any value equal to the token) -> 400.
3. With a token configured: `Authorization: Bearer <token>` compared in constant time, else 401
   (CORS preflights, `OPTIONS`, carry no credentials and pass to the route).

WebSocket refusals are sent before the upgrade with the ASGI "WebSocket Denial Response"
extension, so the client sees the real status instead of a generic 403.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote, unquote_plus, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from binlens.api.requirements import is_loopback_address
from binlens.server.options import ServerOptions

log = logging.getLogger("binlens.server")

# Query parameter names that carry credentials: refused whatever their value.
TOKEN_PARAM_NAMES = frozenset(
    {
        "token",
        "access_token",
        "accesstoken",
        "auth",
        "auth_token",
        "authorization",
        "bearer",
        "api_key",
        "apikey",
        "key",
        "password",
        "secret",
        "jwt",
        "id_token",
    }
)
MIN_TOKEN_LENGTH = 16
_TOKEN_RE = re.compile(r"^[\x21-\x7e]+$")


def validate_token(token: str) -> str:
    """Check a configured token: at least 16 printable ASCII characters, no whitespace."""
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"the token must be at least {MIN_TOKEN_LENGTH} characters long")
    if not _TOKEN_RE.match(token):
        raise ValueError("the token must be printable ASCII without spaces")
    return token


def tokens_equal(given: str, expected: str) -> bool:
    """Compare two tokens in constant time (with respect to their contents)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape"))


def is_loopback_name(host: str) -> bool:
    """True for localhost, ::1 and 127.0.0.0/8 (host names without port or brackets)."""
    h = host.strip().lower().rstrip(".")
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    return h in ("localhost", "::1") or h.endswith(".localhost") or re.fullmatch(r"127(\.\d{1,3}){3}", h) is not None


def resolves_to_loopback(host: str) -> bool:
    """True when every address the listen host `host` resolves to is a loopback address.

    The addresses, not the name, decide: `127.example` may resolve anywhere, and the empty host
    listens on every interface. A name that does not resolve raises ValueError.
    """
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not name:
        return False
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise ValueError(f"--host {host!r} does not resolve: {err}") from None
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def _host_of(authority: str) -> str:
    """The host part of a `Host` header value (`name:port`, `[v6]:port`)."""
    a = authority.strip()
    if a.startswith("["):
        end = a.find("]")
        return a[: end + 1] if end > 0 else a
    return a.rsplit(":", 1)[0] if a.count(":") == 1 else a


class Guard:
    """The checks of one server, usable without ASGI (tests, other transports)."""

    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.allowed_origins = {o.rstrip("/").lower() for o in opts.allowed_origins}
        wildcard = opts.host in ("0.0.0.0", "::", "")
        self.configured_host = None if wildcard else opts.host.lower().strip("[]")

    def origin_allowed(self, origin: str) -> bool:
        """Loopback, the configured host, or an explicitly allowed origin."""
        o = origin.strip().rstrip("/").lower()
        if o in self.allowed_origins:
            return True
        try:
            parts = urlsplit(o)
            host = parts.hostname
        except ValueError:
            return False
        if not host or parts.scheme not in ("http", "https"):
            return False
        return is_loopback_name(host) or (self.configured_host is not None and host == self.configured_host)

    def host_allowed(self, host_header: str | None) -> bool:
        """On a loopback listener only loopback Host names are served (DNS-rebinding defence)."""
        if not self.opts.loopback or host_header is None:
            return True
        return is_loopback_name(_host_of(host_header))

    def query_has_token(self, query_string: bytes) -> bool:
        """A credential-named parameter, or any value equal to the configured token."""
        if not query_string:
            return False
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
        for name, value in pairs:
            if name.strip().lower() in TOKEN_PARAM_NAMES:
                return True
            if self.opts.token and value and tokens_equal(value, self.opts.token):
                return True
        return False

    def authorized(self, authorization: str | None) -> bool:
        """`Authorization: Bearer <token>` matching the configured token (always true without one)."""
        if not self.opts.token:
            return True
        if not authorization:
            return False
        scheme, _, given = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return tokens_equal(given.strip(), self.opts.token)

    def check(self, scope: Scope) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """None when the request may pass, else (status, message, extra headers)."""
        headers = _header_map(scope.get("headers", []))
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            return 403, "this Origin is not allowed: only loopback, the configured host or --allow-origin", []
        if not self.host_allowed(headers.get("host")):
            return 403, "this Host is not allowed on a loopback listener", []
        if self.query_has_token(scope.get("query_string", b"")):
            return 400, "a credential in the query string is refused: send 'Authorization: Bearer <token>'", []
        if scope["type"] == "http" and scope.get("method") == "OPTIONS":
            return None  # CORS preflights carry no credentials; the route answers them
        if not self.authorized(headers.get("authorization")):
            return 401, "missing or wrong bearer token", [(b"www-authenticate", b'Bearer realm="binlens"')]
        return None


_FORWARDED_FOR = re.compile(r'(?i)(?:^|[;,\s])for="?\[?([^\]";,]+)')


def caller_peer(scope: Scope) -> str:
    """The address a request comes from, for trust decisions: the socket's peer, unless a proxy
    names a client (`Forwarded: for=`, `X-Forwarded-For`, `X-Real-IP`, every hop) that is not on
    loopback: then the first such one. A forwarded address can only make a caller less trusted
    (a client cannot claim loopback by sending one). A request with no peer is `unknown`."""
    headers = _header_map(scope.get("headers", []))
    named = _FORWARDED_FOR.findall(headers.get("forwarded", ""))
    named += headers.get("x-forwarded-for", "").split(",") + headers.get("x-real-ip", "").split(",")
    for address in (a.strip() for a in named):
        if address and not is_loopback_address(address):
            return address
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in raw:
        out.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
    return out


async def refuse(
    scope: Scope, send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer an HTTP request, or refuse a WebSocket handshake before the upgrade, with `status`.

    The body is `{"error": {"status", "message"}}`. A server without the WebSocket Denial
    Response extension can only close the handshake (its clients then see 403).
    """
    body = json.dumps({"error": {"status": status, "message": message}}).encode()
    hdrs = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
    ]
    if scope["type"] == "websocket":
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
            return
        await send({"type": "websocket.http.response.start", "status": status, "headers": hdrs})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


class SecurityMiddleware:
    """Pure ASGI middleware applying `Guard.check` to every HTTP request and WebSocket handshake."""

    def __init__(self, app: ASGIApp, opts: ServerOptions) -> None:
        self.app = app
        self.guard = Guard(opts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse or pass on one connection."""
        if scope["type"] in ("http", "websocket"):
            verdict = self.guard.check(scope)
            if verdict is not None:
                status, message, headers = verdict
                log.info("refused %s %s: %d %s", scope["type"], scope.get("path"), status, message)
                await refuse(scope, send, status, message, headers)
                return
        await self.app(scope, receive, send)


# --- logs ------------------------------------------------------------------------------------
_NAMES_ALT = "|".join(sorted(TOKEN_PARAM_NAMES, key=len, reverse=True))
_QUERY_PARAM_RE = re.compile(r"(?i)([?&;](?:" + _NAMES_ALT + r")=)[^&\s\"']*")
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[\x21-\x7e]+")
# `Authorization: <scheme> <value>`, `authorization=<value>`, `(b'authorization', b'<value>')`
_AUTHORIZATION_RE = re.compile(r"""(?i)(authorization['"]?\s*[:=,]\s*b?['"]?(?:[a-z][\w.-]*\s+)?)[^\s'",;&]+""")
# In decoded text: a credential parameter or header name followed by its value.
_SECRET_TEXT_RE = re.compile(r"(?i)(?<![a-z0-9_])(?:" + _NAMES_ALT + r")\s*[=:]|bearer\s+\S")
_WORD_RE = re.compile(r"""[^\s"'<>]+""")  # a URL or header value as logs quote them
_PIECE_SPLIT_RE = re.compile(r"([?&;/])")  # path segments and query parameters, delimiters kept
_DECODE_ROUNDS = 6  # percent-encoding nested deeper than this is not decoded further


def _decodings(text: str) -> set[str]:
    """Every form `text` takes while percent-decoding it again and again, with and without `+` as space."""
    out = {text}
    for decode in (unquote, unquote_plus):
        current = text
        for _ in range(_DECODE_ROUNDS):
            nxt = decode(current)
            if nxt == current:
                break
            out.add(nxt)
            current = nxt
    return out


class RedactingFilter(logging.Filter):
    """Rewrites every record so no token reaches a log: the configured token, bearer and Authorization
    values, credential parameters, in any letter case and percent-, plus- or multiply-encoded."""

    def __init__(self, token: str | None) -> None:
        super().__init__("binlens-redact")
        self.token = token

    def redact(self, text: str) -> str:
        """The text with secrets replaced by `***`."""
        if self.token:
            for form in (self.token, quote(self.token, safe=""), quote_plus(self.token)):
                text = text.replace(form, "***")
        text = _WORD_RE.sub(lambda m: self._redact_word(m.group()), text)
        text = _QUERY_PARAM_RE.sub(r"\1***", text)
        text = _AUTHORIZATION_RE.sub(r"\1***", text)
        return _BEARER_RE.sub(r"\1***", text)

    def _secret_in(self, text: str) -> bool:
        """Whether any decoded form of `text` holds the token or a credential name with its value."""
        token = self.token
        return any((token and token in form) or _SECRET_TEXT_RE.search(form) for form in _decodings(text))

    def _redact_word(self, word: str) -> str:
        """An encoded word (a path with its query, say) with each secret-bearing piece replaced."""
        if "%" not in word and "+" not in word:
            return word  # nothing encoded: the plain patterns in `redact` apply
        pieces = _PIECE_SPLIT_RE.split(word)
        for i in range(0, len(pieces), 2):  # the odd indices are the delimiters
            pieces[i] = self._redact_piece(pieces[i])
        out = "".join(pieces)
        if self.token and any(self.token in form for form in _decodings(out)):
            return "***"  # the token spread over encoded delimiters
        return out

    def _redact_piece(self, piece: str) -> str:
        """One path segment or `name=value` parameter, its value (or all of it) redacted if secret."""
        name, eq, value = piece.partition("=")
        if eq and any(form.strip().lower() in TOKEN_PARAM_NAMES for form in _decodings(name)):
            return f"{name}=***"
        if not self._secret_in(piece):
            return piece
        return f"{name}=***" if eq and not self._secret_in(name) else "***"

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact the formatted message in place (arguments folded in first)."""
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logged as is
            return True
        clean = self.redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, ()
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


class RedactingFormatter(logging.Formatter):
    """A handler's formatter whose whole output is redacted: message, traceback and stack alike."""

    def __init__(self, inner: logging.Formatter | None, redactor: RedactingFilter) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        """The inner formatter's line, redacted."""
        return self.redactor.redact(self.inner.format(record))


def _guard_handler(handler: logging.Handler, filt: RedactingFilter) -> None:
    handler.addFilter(filt)
    if not isinstance(handler.formatter, RedactingFormatter):
        handler.setFormatter(RedactingFormatter(handler.formatter, filt))


def install_log_redaction(
    token: str | None, loggers: Iterable[str] = ("uvicorn", "uvicorn.access", "uvicorn.error")
) -> None:
    """Redact every line the root handlers and uvicorn's loggers write (filter and formatter both)."""
    filt = RedactingFilter(token)
    for handler in logging.getLogger().handlers:
        _guard_handler(handler, filt)
    for name in loggers:
        lg = logging.getLogger(name)
        lg.addFilter(filt)
        for handler in lg.handlers:
            _guard_handler(handler, filt)


_LABEL_TEXT = re.compile(r"[^A-Za-z0-9._+@:-]+")


def client_label(transport: str, info: object, credential: str | None) -> str:
    """The journal's name for a client, the same on each of its calls and connections:
    `TRANSPORT:NAME/VERSION` from what the client says it is (MCP's clientInfo; the first product
    of a WebSocket client's User-Agent), `TRANSPORT:unknown` without it, then `#` and 12 hex digits
    of a digest of the credential it authenticated with, when it sent one (never the credential)."""
    name = version = ""
    if isinstance(info, dict):
        name = _LABEL_TEXT.sub("_", str(info.get("name") or ""))[:64]
        version = _LABEL_TEXT.sub("_", str(info.get("version") or ""))[:32]
    label = f"{transport}:{name or 'unknown'}" + (f"/{version}" if version else "")
    if credential:
        digest = hashlib.sha256(b"binlens journal client\0" + credential.encode("utf-8", "replace")).hexdigest()
        label += f"#{digest[:12]}"
    return label


def user_agent_product(user_agent: str | None) -> dict[str, str] | None:
    """The first product of a User-Agent header (`name/version`), as `{name, version}`."""
    first = (user_agent or "").split(" ", 1)[0].strip()
    if not first:
        return None
    name, _, version = first.partition("/")
    return {"name": name, "version": version}
