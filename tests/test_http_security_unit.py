"""The security checks and the log filter on their own (the server tests cover them end to end)."""

from __future__ import annotations

import logging
import socket
import sys

import pytest

from binlens.server.auth import (
    Guard,
    RedactingFilter,
    RedactingFormatter,
    is_loopback_name,
    resolves_to_loopback,
    tokens_equal,
    validate_token,
)
from binlens.server.options import ServerOptions

TOKEN = "abc/def+ghi=jkl-0000"


@pytest.mark.parametrize(
    ("name", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST.", True),
        ("app.localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("[::1]", True),
        ("::1", True),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example", False),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
    ],
)
def test_loopback_names(name: str, loopback: bool) -> None:
    assert is_loopback_name(name) is loopback


@pytest.mark.parametrize(
    ("addresses", "loopback"),
    [
        (["203.0.113.7"], False),  # a name that looks like 127/8 but points elsewhere
        (["127.0.0.1", "203.0.113.7"], False),  # one address off loopback is enough to refuse
        (["127.0.0.1", "::1"], True),
        (["fe80::1%lo"], False),
    ],
)
def test_listen_host_judged_by_every_resolved_address(
    monkeypatch: pytest.MonkeyPatch, addresses: list[str], loopback: bool
) -> None:
    # This machine's resolver knows no name that leads off loopback: the answer is stood in for.
    def fake(host: str, *_a: object, **_k: object) -> list[tuple]:
        assert host == "127.attacker.example"
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    assert resolves_to_loopback("127.attacker.example") is loopback
    assert ServerOptions(host="127.attacker.example", host_is_loopback=loopback).loopback is loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("[::1]", True)]
    + [("0.0.0.0", False), ("::", False), ("", False), ("127.example", False), ("127.1.2.3.example", False)],
)
def test_loopback_of_options_as_written(host: str, loopback: bool) -> None:
    assert ServerOptions(host=host).loopback is loopback


def test_unresolvable_listen_host_is_an_error() -> None:
    with pytest.raises(ValueError, match="does not resolve"):
        resolves_to_loopback("127.example")
    assert resolves_to_loopback("localhost") and resolves_to_loopback("::1") and not resolves_to_loopback("0.0.0.0")


def test_origin_rules_follow_the_configured_host() -> None:
    lan = Guard(ServerOptions(host="192.168.1.5", token=TOKEN, allowed_origins=["https://ui.example.org/"]))
    assert lan.origin_allowed("http://192.168.1.5:8765")
    assert lan.origin_allowed("https://ui.example.org")
    assert not lan.origin_allowed("http://192.168.1.6:8765")
    assert not lan.origin_allowed("ftp://localhost")
    assert lan.host_allowed("192.168.1.5:8765")  # no Host rule off loopback: the token protects it
    anywhere = Guard(ServerOptions(host="0.0.0.0", token=TOKEN))
    assert not anywhere.origin_allowed("http://0.0.0.0:8765")
    local = Guard(ServerOptions())
    assert local.host_allowed("[::1]:8765") and local.host_allowed("localhost") and local.host_allowed(None)
    assert not local.host_allowed("evil.example:8765")


def test_query_tokens_and_bearer() -> None:
    g = Guard(ServerOptions(token=TOKEN))
    assert g.query_has_token(b"a=abc%2Fdef%2Bghi%3Djkl-0000")  # the token itself, percent-encoded
    assert g.query_has_token(b"Access_Token=x") and g.query_has_token(b"apikey=")
    assert not g.query_has_token(b"sessionId=1&cursor=abc")
    assert g.authorized(f"Bearer {TOKEN}") and g.authorized(f"BEARER  {TOKEN} ")
    assert not g.authorized(None) and not g.authorized(f"Token {TOKEN}") and not g.authorized("Bearer x")
    assert Guard(ServerOptions()).authorized(None)  # no token configured: nothing to check
    assert tokens_equal("same-value", "same-value") and not tokens_equal("same-value", "same-valuE")
    with pytest.raises(ValueError):
        validate_token("short")
    with pytest.raises(ValueError):
        validate_token("has a space in it, sixteen+")


def test_filter_redacts_every_form_of_the_token() -> None:
    f = RedactingFilter(TOKEN)
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/1.1" %d',
        ("127.0.0.1:5", "GET", "/x/abc%2Fdef%2Bghi%3Djkl-0000?token=zzz&ok=1", 400),
        None,
    )
    assert f.filter(record)
    text = record.getMessage()
    assert TOKEN not in text and "abc%2F" not in text and "zzz" not in text and "ok=1" in text
    assert f.redact("Authorization: Bearer sekrit-value") == "Authorization: Bearer ***"
    assert RedactingFilter(None).redact("plain ?cursor=1") == "plain ?cursor=1"


def test_formatter_redacts_tracebacks_and_every_encoding() -> None:
    f = RedactingFilter(TOKEN)
    fmt = logging.Formatter("%(message)s")
    guarded = RedactingFormatter(fmt, f)
    encoded = "".join(f"%{ord(c):02x}" for c in TOKEN)
    try:
        raise RuntimeError(f"bad url /x?q={encoded.replace('%', '%25')}")
    except RuntimeError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed: %s", (f"?Token={encoded}",), sys.exc_info()
        )
    text = guarded.format(record)
    assert "RuntimeError" in text and "?Token=***" in text
    assert encoded not in text and "%2574" not in text and TOKEN not in text
    for raw, clean in [
        ("/x?AUTH_TOKEN=zz&ok=1", "/x?AUTH_TOKEN=***&ok=1"),
        ("/x?x=%2561uthorization%253A%2520Basic%2520Zm9v", "/x?x=***"),
        ("/x?x=Bearer+abcdef", "/x?x=***"),
        ("/x?cursor=a%2Fb&limit=5", "/x?cursor=a%2Fb&limit=5"),
    ]:
        assert f.redact(raw) == clean
