"""collector.urlguard: the SSRF table, the allowlist, and connecting to the checked address.

No real DNS: names go through an injected resolver. The connect tests use real servers on
127.0.0.1 reached through made-up names (``engine.test``) that only the injected resolver
knows, so a request that arrives proves the connection went to the pinned address.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collector.http1 import ConnectFailed, Connection, route
from collector.urlguard import (
    CheckedURL,
    URLPolicy,
    check_target_url,
    parse_allowlist,
    pinned_address,
    same_origin,
)
from core.errors import ConfigError, URLRefused
from tests.collector.exposerver import expo_server

PUBLIC = "93.184.216.34"
NAMES: dict[str, list[str]] = {
    "public.test": [PUBLIC],
    "private.test": ["10.0.0.7"],
    "mixed.test": [PUBLIC, "192.168.0.9"],  # one good answer does not excuse a bad one
    "metadata.test": ["169.254.169.254"],
    "mapped.test": ["::ffff:127.0.0.1"],
    "public6.test": ["2606:2800:220:1:248:1893:25c8:1946"],
}


class FakeDNS:
    """An injected resolver: answers from NAMES (or ``extra``) and counts its calls."""

    def __init__(self, extra: dict[str, list[str]] | None = None) -> None:
        self.names = {**NAMES, **(extra or {})}
        self.calls: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        if host not in self.names:
            raise OSError(-2, "Name or service not known")
        return list(self.names[host])


# (url, refused kind, what the message says besides the URL)
REFUSED: list[tuple[str, str, str]] = [
    ("ftp://public.test/metrics", "scheme", "scheme 'ftp' not allowed"),
    ("file:///etc/passwd", "scheme", "scheme 'file' not allowed"),
    ("gopher://public.test:70/_x", "scheme", "scheme 'gopher' not allowed"),
    ("//public.test/metrics", "scheme", "scheme '(none)' not allowed"),
    ("http://user:hunter2@public.test/metrics", "userinfo", "credentials in the URL"),
    ("http://@public.test/metrics", "userinfo", "credentials in the URL"),
    ("http://169.254.169.254/latest/meta-data/", "cloud-metadata",
     "cloud-metadata address 169.254.169.254 is never allowed"),
    ("http://[fd00:ec2::254]/latest/", "cloud-metadata",
     "cloud-metadata address fd00:ec2::254 is never allowed"),
    ("http://[::ffff:169.254.169.254]/", "cloud-metadata",
     "cloud-metadata address 169.254.169.254 (as ::ffff:169.254.169.254) is never allowed"),
    ("http://100.100.100.200/latest/", "cloud-metadata", "100.100.100.200 is never allowed"),
    ("http://metadata.test/", "cloud-metadata", "169.254.169.254 (from metadata.test)"),
    ("http://169.254.1.1:8000/metrics", "link-local", "link-local address 169.254.1.1 not"),
    ("http://[fe80::1]/metrics", "link-local", "link-local address fe80::1 not allowed"),
    ("http://127.0.0.1:8000/metrics", "loopback",
     "loopback address 127.0.0.1 not allowed (allowlist it with --allow-network 127.0.0.1/32"),
    ("http://127.9.9.9/", "loopback", "loopback address 127.9.9.9 not allowed"),
    ("http://2130706433/metrics", "loopback",
     "loopback address 127.0.0.1 (written '2130706433') not allowed (write it as 127.0.0.1"),
    ("http://0177.0.0.1/metrics", "loopback", "127.0.0.1 (written '0177.0.0.1') not allowed"),
    ("http://0x7f.1/metrics", "loopback", "127.0.0.1 (written '0x7f.1') not allowed"),
    ("http://0x7f000001/", "loopback", "127.0.0.1 (written '0x7f000001') not allowed"),
    ("http://127.1/metrics", "loopback", "127.0.0.1 (written '127.1') not allowed"),
    ("http://127.0.0.1./", "loopback", "127.0.0.1 (written '127.0.0.1.') not allowed"),
    ("http://[::1]:8000/metrics", "loopback", "loopback address ::1 not allowed"),
    ("http://[::ffff:127.0.0.1]/", "loopback", "127.0.0.1 (as ::ffff:127.0.0.1) not allowed"),
    ("http://[::ffff:7f00:1]/", "loopback", "127.0.0.1 (as ::ffff:127.0.0.1) not allowed"),
    ("http://[64:ff9b::7f00:1]/", "loopback", "127.0.0.1 (as 64:ff9b::7f00:1) not allowed"),
    ("http://mapped.test/", "loopback", "127.0.0.1 (as ::ffff:127.0.0.1) (from mapped.test)"),
    ("http://10.1.2.3/metrics", "private", "private address 10.1.2.3 not allowed"),
    ("http://172.16.0.1/metrics", "private", "private address 172.16.0.1 not allowed"),
    ("http://172.31.255.255/", "private", "private address 172.31.255.255 not allowed"),
    ("http://192.168.1.1/metrics", "private", "private address 192.168.1.1 not allowed"),
    ("http://100.64.0.1/", "private", "private address 100.64.0.1 not allowed"),
    ("http://[fc00::1]/metrics", "private", "private address fc00::1 not allowed"),
    ("http://[fd12:3456::1]/", "private", "private address fd12:3456::1 not allowed"),
    ("http://[2002:a00:1::]/", "private", "10.0.0.1 (as 2002:a00:1::) not allowed"),
    ("http://0.0.0.0:8000/metrics", "unspecified", "unspecified address 0.0.0.0 not allowed"),
    ("http://0/", "unspecified", "0.0.0.0 (written '0') not allowed"),
    ("http://[::]/", "unspecified", "unspecified address :: not allowed"),
    ("http://224.0.0.1/", "multicast", "multicast address 224.0.0.1 not allowed"),
    ("http://[ff02::1]/", "multicast", "multicast address ff02::1 not allowed"),
    ("http://255.255.255.255/", "broadcast", "broadcast address 255.255.255.255 not"),
    ("http://240.0.0.1/", "reserved", "reserved address 240.0.0.1 not allowed"),
    ("http://192.0.2.1/", "reserved", "reserved address 192.0.2.1 not allowed"),
    ("http://[2001:db8::1]/", "reserved", "reserved address 2001:db8::1 not allowed"),
    ("http://private.test:8000/metrics", "private",
     "private address 10.0.0.7 (from private.test) not allowed"),
    ("http://mixed.test/metrics", "private",
     "private address 192.168.0.9 (from mixed.test) not allowed"),
    ("http://1572395042/", "ambiguous",
     "IPv4 address written '1572395042' (read as 93.184.216.34) is ambiguous"),
    ("http://010.0.0.1/", "ambiguous", "written '010.0.0.1' (read as 8.0.0.1) is ambiguous"),
    ("http://1.2.3.256/", "malformed", "'1.2.3.256' is not a valid IPv4 address"),
    ("http://08.8.8.8/", "malformed", "'08.8.8.8' is not a valid IPv4 address (octal)"),
    ("http://1.2.3.4.5/", "malformed", "'1.2.3.4.5' is not a valid IPv4 address"),
    ("http://engine.123/", "malformed", "'engine.123' is not a valid IPv4 address"),
    ("http://[fe80::1%25eth0]/", "malformed", "IPv6 zone identifiers are not allowed"),
    ("http://public.test:0/", "malformed", "port 0"),
    ("http://public.test:99999/", "malformed", "Port out of range"),
    ("http://public.test\\@10.0.0.1/", "malformed", "whitespace, control characters or '\\'"),
    ("http://public.test/me trics", "malformed", "whitespace, control characters"),
    ("http://public.test\t/", "malformed", "whitespace, control characters"),
    ("http://ünïcode.test/", "malformed", "non-ASCII URL"),
    ("http://bad!name.test/", "malformed", "'bad!name.test' is not a valid host name"),
    ("http:///metrics", "malformed", "the URL has no host"),
    ("", "malformed", "the URL must be a non-empty string"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "kind", "says"), REFUSED)
def test_check_target_url_unsafe_refused_naming_url_and_kind(
    url: str, kind: str, says: str
) -> None:
    with pytest.raises(URLRefused) as info:
        check_target_url(url, resolve=FakeDNS())
    assert isinstance(info.value, ConfigError)  # the API answers it as a bad field
    assert info.value.kind == kind
    assert says in str(info.value)
    assert str(info.value).startswith("target URL ")
    if url and "@" not in url:
        assert url in str(info.value)


def test_check_target_url_userinfo_password_never_in_message() -> None:
    with pytest.raises(URLRefused) as info:
        check_target_url("http://scraper:hunter2@public.test:8000/metrics", resolve=FakeDNS())
    assert "hunter2" not in str(info.value) and "scraper" not in str(info.value)
    assert "http://***@public.test:8000/metrics" in str(info.value)


# (url, allowlist, pinned)
ALLOWED: list[tuple[str, tuple[str, ...], str]] = [
    ("http://127.0.0.1:8000/metrics", ("127.0.0.0/8",), "127.0.0.1"),
    ("http://127.0.0.1:8000/metrics", ("127.0.0.1/32",), "127.0.0.1"),
    ("http://127.0.0.1:8000/metrics", ("127.0.0.1",), "127.0.0.1"),  # a bare address
    ("http://10.1.2.3/metrics", ("10.0.0.0/8",), "10.1.2.3"),
    ("http://private.test:8000/metrics", ("10.0.0.0/24",), "10.0.0.7"),
    ("http://mixed.test/metrics", ("192.168.0.0/16",), PUBLIC),
    ("http://[::1]:8000/metrics", ("::1/128",), "::1"),
    ("http://[::ffff:127.0.0.1]/", ("127.0.0.0/8",), "127.0.0.1"),  # judged as its IPv4
    ("http://[fc00::1]/", ("fc00::/7",), "fc00::1"),
    ("http://169.254.1.1/", ("169.254.0.0/16",), "169.254.1.1"),
    ("http://192.168.1.1/", ("10.0.0.0/8", "192.168.1.0/24"), "192.168.1.1"),
    ("http://[64:ff9b::5db8:d822]/", (), "64:ff9b::5db8:d822"),  # NAT64 of a public address
    ("http://[2002:5db8:d822::1]/", (), "2002:5db8:d822::1"),  # 6to4 of a public address
]


@pytest.mark.parametrize(("url", "allow", "pinned"), ALLOWED)
def test_check_target_url_allowlisted_accepted(
    url: str, allow: tuple[str, ...], pinned: str
) -> None:
    checked = check_target_url(url, allow=allow, resolve=FakeDNS())
    assert checked.pinned == pinned and pinned in checked.addresses


@pytest.mark.parametrize(
    ("url", "allow"),
    [
        ("http://169.254.169.254/latest/", ("169.254.0.0/16",)),
        ("http://169.254.169.254/latest/", ("0.0.0.0/0",)),
        ("http://[fd00:ec2::254]/", ("fd00::/8",)),
        ("http://[::ffff:169.254.169.254]/", ("169.254.0.0/16", "::/0")),
        ("http://metadata.test/", ("169.254.0.0/16",)),
        ("http://169.254.170.2/v2/credentials", ("169.254.0.0/16",)),
    ],
)
def test_check_target_url_metadata_refused_even_inside_allowlist(
    url: str, allow: tuple[str, ...]
) -> None:
    with pytest.raises(URLRefused) as info:
        check_target_url(url, allow=allow, resolve=FakeDNS())
    assert info.value.kind == "cloud-metadata"


@pytest.mark.parametrize("url", ["http://0x7f.1/", "http://2130706433/", "http://127.1/"])
def test_check_target_url_odd_spelling_of_allowlisted_address_refused_as_ambiguous(
    url: str,
) -> None:
    with pytest.raises(URLRefused) as info:
        check_target_url(url, allow=("127.0.0.0/8",))
    assert info.value.kind == "ambiguous" and "write it as 127.0.0.1" in str(info.value)


def test_check_target_url_public_name_resolved_once_and_pinned() -> None:
    dns = FakeDNS()
    checked = check_target_url("https://public.test:8443/metrics?x=1", resolve=dns)
    assert checked == CheckedURL(
        url="https://public.test:8443/metrics?x=1",
        scheme="https",
        host="public.test",
        port=8443,
        addresses=(PUBLIC,),
        pinned=PUBLIC,
    )
    assert dns.calls == [("public.test", 8443)]


@pytest.mark.parametrize(
    ("url", "port"), [("http://public.test/m", 80), ("https://PUBLIC.test/m", 443)]
)
def test_check_target_url_default_port_given_to_resolver(url: str, port: int) -> None:
    dns = FakeDNS()
    assert check_target_url(url, resolve=dns).port == port
    assert dns.calls == [("public.test", port)]


@pytest.mark.parametrize(
    ("url", "pinned"),
    [
        (f"http://{PUBLIC}:8000/metrics", PUBLIC),
        ("http://[2606:2800:220:1:248:1893:25c8:1946]/", "2606:2800:220:1:248:1893:25c8:1946"),
        ("http://public6.test/", "2606:2800:220:1:248:1893:25c8:1946"),
    ],
)
def test_check_target_url_public_address_accepted_literal_not_resolved(
    url: str, pinned: str
) -> None:
    dns = FakeDNS()
    assert check_target_url(url, resolve=dns).pinned == pinned
    assert len(dns.calls) == (1 if ".test" in url else 0)


@pytest.mark.parametrize(
    ("answers", "says"),
    [(None, "cannot resolve nowhere.test"), ([], "nowhere.test resolves to no address"),
     (["not-an-ip"], "resolver gave 'not-an-ip'")],
)  # fmt: skip
def test_check_target_url_unresolvable_name_config_error_not_refusal(
    answers: list[str] | None, says: str
) -> None:
    dns = FakeDNS({} if answers is None else {"nowhere.test": answers})
    with pytest.raises(ConfigError, match=says) as info:
        check_target_url("http://nowhere.test/metrics", resolve=dns)
    assert not isinstance(info.value, URLRefused)


MALFORMED_ALLOW: list[tuple[object, str]] = [
    (["10.0.0.1/8"], "host bits set (did you mean 10.0.0.0/8?)"),
    (["nope"], "'nope': not a network"),
    (["10.0.0.0/33"], "not a network"),
    ([""], "not a network"),
    ([None], "not a network"),
    ("10.0.0.0/8", "expected a list of CIDRs, got the string"),
    (["169.254.169.254"], "cloud-metadata addresses cannot be allowlisted"),
    (["fd00:ec2::254/128"], "cloud-metadata addresses cannot be allowlisted"),
]


@pytest.mark.parametrize(("allow", "says"), MALFORMED_ALLOW)
def test_parse_allowlist_malformed_raises_config_error(allow: object, says: str) -> None:
    with pytest.raises(ConfigError, match="--allow-network") as info:
        parse_allowlist(allow)  # type: ignore[arg-type]
    assert says in str(info.value)
    with pytest.raises(ConfigError):
        URLPolicy(allow=allow)  # type: ignore[arg-type]  # checked once, when built


def test_url_policy_check_same_as_check_target_url() -> None:
    policy = URLPolicy(allow=("10.0.0.0/8",), resolve=FakeDNS())
    assert policy.check("http://private.test/m").pinned == "10.0.0.7"
    with pytest.raises(URLRefused, match="loopback"):
        policy.check("http://127.0.0.1/m")


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.7:8000/m", "http://[fd00::7]:8000/m", "http://8.8.8.8/m"],
)
def test_url_policy_check_without_lookup_address_literal_same_as_check(url: str) -> None:
    policy = URLPolicy(allow=("10.0.0.0/8", "fd00::/8"), resolve=FakeDNS())
    assert policy.check_without_lookup(url) == policy.check(url)


def test_url_policy_check_without_lookup_name_none_refusal_raised() -> None:
    dns = FakeDNS()
    policy = URLPolicy(allow=("10.0.0.0/8",), resolve=dns)
    assert policy.check_without_lookup("http://private.test/m") is None
    assert dns.calls == []  # the name is left to check(), in a thread
    for url, says in [("http://127.0.0.1/m", "loopback"), ("ftp://10.0.0.7/m", "scheme"),
                      ("http://bad_name!/m", "not a valid host name")]:  # fmt: skip
        with pytest.raises(URLRefused, match=says):
            policy.check_without_lookup(url)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("http://h:80/a", "http://H/b?c", True),
        ("https://h/a", "https://h:443/", True),
        ("http://h/a", "https://h/a", False),
        ("http://h:8000/a", "http://h:8001/a", False),
        ("http://h/a", "http://h.evil/a", False),
        ("http://h/a", "http://u@h/a", False),
        ("http://u@h/a", "http://u@h/a", False),  # userinfo is never an origin
        ("ftp://h/a", "ftp://h/a", False),
    ],
)
def test_same_origin_scheme_host_port(a: str, b: str, same: bool) -> None:
    assert same_origin(a, b) is same


# --------------------------------------------------------------------------- connecting


def _get(
    url: str, connect_to: str | None, *, tls: ssl.SSLContext | None = None
) -> tuple[int, bytes]:
    """One GET through the scraper's connection (collector.http1), to ``connect_to``."""

    async def go() -> tuple[int, bytes]:
        conn = Connection(lambda: tls or ssl.create_default_context(), user_agent="test")
        try:
            resp = await conn.get(url, {"Accept": "text/plain"}, connect_to=connect_to)
            body = b"".join([c async for c in conn.body(resp)])
            return resp.status, body
        finally:
            await conn.aclose()

    return asyncio.run(go())


def test_pinned_address_connects_there_and_keeps_host_header() -> None:
    with expo_server() as srv:
        srv.add("/metrics", b"up 1\n")
        port = int(srv.base.rsplit(":", 1)[1])
        url = f"http://engine.test:{port}/metrics"
        # engine.test exists only in the injected resolver: reaching the server at all
        # means the connection went to the pinned address, not through a second lookup.
        checked = check_target_url(
            url, allow=("127.0.0.1/32",), resolve=FakeDNS({"engine.test": ["127.0.0.1"]})
        )
        assert pinned_address(checked) == "127.0.0.1"
        status, body = _get(url, pinned_address(checked))
        route = srv.route("/metrics")
    assert status == 200 and body == b"up 1\n"
    assert route.hosts == [f"engine.test:{port}"]
    assert route.accepts == ["text/plain"]


def test_pinned_address_same_origin_path_allowed_other_origin_refused() -> None:
    checked = check_target_url("http://public.test:8000/metrics", resolve=FakeDNS())
    assert pinned_address(checked, "http://public.test:8000/metrics/?a=1") == PUBLIC
    for other in ("http://elsewhere.test:8000/", "http://public.test:8001/metrics"):
        with pytest.raises(URLRefused) as info:
            pinned_address(checked, other)
        assert info.value.kind == "redirect"


def test_pinned_ipv6_address_route_bracketed() -> None:
    checked = check_target_url("http://[::1]:9000/m", allow=("::1/128",))
    r = route(checked.url, connect_to=pinned_address(checked))
    assert (r.address, r.port, r.host_header, r.target) == ("::1", 9000, "[::1]:9000", "/m")


@dataclass
class _TLSSeen:
    sni: list[str | None] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)


@contextmanager
def _tls_server(tmp_path: Path, name: str) -> Iterator[tuple[int, Path, _TLSSeen]]:
    """An https server on 127.0.0.1 with a self-signed certificate for ``name`` only."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    seen = _TLSSeen()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.sni_callback = lambda _sock, server_name, _ctx: seen.sni.append(server_name)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.hosts.append(self.headers.get("Host", ""))
            body = b"up 1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.daemon = True
    thread.start()
    try:
        yield int(srv.server_address[1]), cert, seen
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_pinned_https_sends_sni_and_verifies_certificate_name(tmp_path: Path) -> None:
    with _tls_server(tmp_path, "engine.test") as (port, cert, seen):
        url = f"https://engine.test:{port}/metrics"
        checked = check_target_url(
            url, allow=("127.0.0.1/32",), resolve=FakeDNS({"engine.test": ["127.0.0.1"]})
        )
        # The certificate names engine.test only: the handshake succeeds only if the
        # client verified it against the name (not against 127.0.0.1).
        trust = ssl.create_default_context(cafile=str(cert))
        status, body = _get(url, pinned_address(checked), tls=trust)
        # Without the name the one checked would be the pinned address: refused.
        with pytest.raises(ConnectFailed, match="certificate"):
            _get(f"https://127.0.0.1:{port}/metrics", None, tls=trust)
    assert status == 200 and body == b"up 1\n"
    assert seen.sni[0] == "engine.test" and seen.hosts == [f"engine.test:{port}"]
