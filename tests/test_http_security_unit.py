"""The security checks and the log filter on their own (the server tests cover them end to end)."""

from __future__ import annotations

import logging

import pytest

from binlens.server.auth import Guard, RedactingFilter, is_loopback_name, tokens_equal, validate_token
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
