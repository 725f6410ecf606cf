"""The SSRF guard for scrape targets registered at run time (``POST /v1/targets``, the store).

A URL somebody else registered is checked before kvscope connects to it (http/https, no
userinfo, every resolved address outside loopback, private, link-local and other special
ranges unless allowlisted, cloud-metadata addresses always refused, only dotted-decimal
IPv4), and the connection then goes to the very address that was checked
(:func:`pinned_address`), so DNS rebinding cannot redirect the scrape.

Rules: collector/DESIGN.md#urlguard
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit, urlunsplit

from core.errors import ConfigError, URLRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]  # (host, port) -> addresses, getaddrinfo's order

SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
ALLOW_FLAG = "--allow-network"  # kvscope collect's flag; the API reads the setting below
ALLOW_SETTING = "KVSCOPE_ALLOWED_TARGET_NETWORKS"

_v4 = ipaddress.IPv4Network
_v6 = ipaddress.IPv6Network

# Never connected to, whatever the allowlist says. An allowlist names the networks the
# engines live in ("our VPC is 10.0.0.0/8", "the node is 169.254.0.0/16-reachable"), not the
# cloud's credential services that happen to share them: one target URL pointed at
# 169.254.169.254 would hand the instance's IAM credentials to whoever registered it.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OCI, OpenStack instance metadata
        "169.254.170.2",  # AWS ECS task credentials
        "169.254.170.23",  # AWS EKS Pod Identity agent
        "100.100.100.200",  # Alibaba Cloud metadata
        "fd00:ec2::254",  # AWS instance metadata over IPv6
        "fd00:ec2::23",  # AWS EKS Pod Identity agent over IPv6
    )
)

# (kind, networks), first match wins; an address in none of them that Python does not call
# global is "reserved". Explicit tables: ipaddress' is_private/is_global changed meaning
# across 3.11 patch releases.
_KINDS: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("unspecified", (_v4("0.0.0.0/8"), _v6("::/128"))),
    ("loopback", (_v4("127.0.0.0/8"), _v6("::1/128"))),
    ("link-local", (_v4("169.254.0.0/16"), _v6("fe80::/10"))),
    ("multicast", (_v4("224.0.0.0/4"), _v6("ff00::/8"))),
    ("broadcast", (_v4("255.255.255.255/32"),)),
    (
        "private",
        (
            _v4("10.0.0.0/8"),
            _v4("172.16.0.0/12"),
            _v4("192.168.0.0/16"),
            _v4("100.64.0.0/10"),  # RFC 6598 shared address space (carrier-grade NAT)
            _v6("fc00::/7"),
            _v6("fec0::/10"),  # deprecated site-local
        ),
    ),
    ("reserved", (_v4("240.0.0.0/4"),)),
)
_NAT64 = _v6("64:ff9b::/96")

_NUMBER = re.compile(r"(?:0[xX][0-9a-fA-F]*|[0-9]+)\Z")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*\.?\Z")
_FORBIDDEN = re.compile(r"[\x00-\x20\x7f\\]")


@dataclass(frozen=True, slots=True)
class CheckedURL:
    """A target URL that passed the guard, and the address to connect to."""

    url: str  # as given
    scheme: str  # "http" or "https"
    host: str  # lower-case; an IPv6 literal without its brackets
    port: int  # explicit or the scheme's default
    addresses: tuple[str, ...]  # every address the host stands for, each checked
    pinned: str  # the one to connect to (the first of ``addresses``)


def check_target_url(
    url: str, *, allow: Sequence[str] = (), resolve: Resolver | None = None
) -> CheckedURL:
    """Check ``url`` against the rules of DESIGN.md#urlguard; ``allow``: CIDRs that may be reached.

    ``resolve(host, port)`` returns the addresses of a name (default: getaddrinfo); it is
    called at most once, and never for an IP literal. Raises URLRefused (a ConfigError)
    naming the URL and the refused kind, or ConfigError when the name does not resolve or
    an allowlist entry is not a network.
    """
    return _check(url, parse_allowlist(allow), resolve or resolve_host)


def split_allowlist(value: object) -> object:
    """A comma-separated allowlist (the ALLOW_SETTING environment form) as a tuple of its
    entries; any other value as it is (for settings validators: pydantic checks the type)."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def parse_allowlist(allow: Sequence[str]) -> tuple[IPNetwork, ...]:
    """The networks of CIDR strings (a bare address is a /32 or /128); ConfigError if bad."""
    if isinstance(allow, str):
        raise ConfigError(f"{ALLOW_FLAG}: expected a list of CIDRs, got the string {allow!r}")
    networks: list[IPNetwork] = []
    for entry in allow:
        text = entry.strip() if isinstance(entry, str) else entry
        try:
            net = ipaddress.ip_network(text, strict=True)
        except (TypeError, ValueError) as exc:
            hint = ""
            if isinstance(text, str) and "has host bits set" in str(exc):
                hint = f" (did you mean {ipaddress.ip_network(text, strict=False)}?)"
            raise ConfigError(f"{ALLOW_FLAG} {entry!r}: not a network: {exc}{hint}") from exc
        if net.num_addresses == 1 and net.network_address in METADATA_ADDRESSES:
            raise ConfigError(
                f"{ALLOW_FLAG} {entry!r}: cloud-metadata addresses cannot be allowlisted"
            )
        networks.append(net)
    return tuple(networks)


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``getaddrinfo`` gives for ``host`` (TCP), in its order, each once."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True, slots=True)
class URLPolicy:
    """An allowlist (and resolver) fixed once: ``check(url)`` is :func:`check_target_url`."""

    allow: tuple[str, ...] = ()
    resolve: Resolver | None = None
    _networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_networks", parse_allowlist(self.allow))

    def check(self, url: str) -> CheckedURL:
        return _check(url, self._networks, self.resolve or resolve_host)

    def check_without_lookup(self, url: str) -> CheckedURL | None:
        """``check(url)`` when it needs no name lookup (an address literal, or a URL refused
        before any lookup); None when the host is a name to resolve."""
        try:
            return _check(url, self._networks, _no_lookup)
        except _LookupNeeded:
            return None


class _LookupNeeded(Exception):
    """Raised by :func:`_no_lookup`: the URL's host is a name."""


def _no_lookup(host: str, port: int) -> list[str]:
    raise _LookupNeeded(host)


def same_origin(a: str, b: str) -> bool:
    """Whether two http(s) URLs without userinfo have the same scheme, host and port."""
    origin = _origin(a)
    return origin is not None and origin == _origin(b)


def pinned_address(checked: CheckedURL, url: str | None = None) -> str:
    """The address to connect to for ``url`` (default ``checked.url``): ``checked.pinned``.

    The scraper (collector.http1) connects there and still sends the URL's own Host header
    and, for https, its name as TLS SNI and as the certificate name. ``url`` may differ from
    ``checked.url`` only in path and query (a same-origin redirect); anything else raises
    URLRefused.
    """
    target = checked.url if url is None else url
    if not same_origin(target, checked.url):
        raise URLRefused(
            _display(target), "redirect", f"not on the checked origin of {checked.url}"
        )
    return checked.pinned


# --------------------------------------------------------------------------- the checks


def _check(url: str, networks: tuple[IPNetwork, ...], resolve: Resolver) -> CheckedURL:
    parts = _split(url)
    scheme, host = parts.scheme, parts.hostname or ""
    port = _port(url, parts)
    name = spelling = None  # the DNS name resolved; a non-canonical IPv4 spelling
    if "[" in parts.netloc:  # an IPv6 literal
        if "%" in host:
            raise URLRefused(_display(url), "malformed", "IPv6 zone identifiers are not allowed")
        try:
            addresses: list[IPAddress] = [ipaddress.IPv6Address(host)]
        except ValueError as exc:
            raise URLRefused(_display(url), "malformed", str(exc)) from exc
    elif (v4 := _inet_aton(url, host)) is not None:
        addresses = [v4]
        spelling = None if str(v4) == host else host
    else:
        addresses = _resolve(url, host, port, resolve)
        name = host
    for address in addresses:
        _judge(url, address, networks, name=name, spelling=spelling)
    if spelling is not None:
        raise URLRefused(
            _display(url),
            "ambiguous",
            f"IPv4 address written {spelling!r} (read as {addresses[0]}) is ambiguous: "
            f"write it as {addresses[0]}",
        )
    # A mapped address is connected to as its IPv4; NAT64/6to4 ones stay IPv6 (translated
    # by the network, the only way a v6-only host reaches them).
    texts = tuple(dict.fromkeys(str(_mapped(a) or a) for a in addresses))
    return CheckedURL(
        url=url, scheme=scheme, host=host, port=port, addresses=texts, pinned=texts[0]
    )


def _split(url: str) -> SplitResult:
    if not isinstance(url, str) or not url:
        raise URLRefused(repr(url), "malformed", "the URL must be a non-empty string")
    if _FORBIDDEN.search(url):
        raise URLRefused(
            _display(url), "malformed", "whitespace, control characters or '\\' in the URL"
        )
    if not url.isascii():
        raise URLRefused(_display(url), "malformed", "non-ASCII URL (write names as xn--…)")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise URLRefused(_display(url), "malformed", str(exc)) from exc
    if parts.scheme not in SCHEMES:
        raise URLRefused(
            _display(url),
            "scheme",
            f"scheme {parts.scheme or '(none)'!r} not allowed (http, https)",
        )
    if "@" in parts.netloc:
        raise URLRefused(_display(url), "userinfo", "credentials in the URL are not allowed")
    if not parts.hostname:
        raise URLRefused(_display(url), "malformed", "the URL has no host")
    return parts


def _port(url: str, parts: SplitResult) -> int:
    try:
        port = parts.port
    except ValueError as exc:
        raise URLRefused(_display(url), "malformed", str(exc)) from exc
    if port == 0:
        raise URLRefused(_display(url), "malformed", "port 0")
    return DEFAULT_PORTS[parts.scheme] if port is None else port


def _inet_aton(url: str, host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host whose last label is a number denotes, as inet_aton reads it.

    1 to 4 parts, each decimal, octal (leading 0) or hex (0x); the last part fills the
    remaining bytes (``127.1`` is 127.0.0.1, ``2130706433`` is 127.0.0.1). None when the
    host is a name (its last label is not a number).
    """
    labels = host.removesuffix(".").split(".")
    if not _NUMBER.match(labels[-1]):
        return None
    values: list[int] = []
    for label in labels:
        if not _NUMBER.match(label):
            raise URLRefused(_display(url), "malformed", f"{host!r} is not a valid IPv4 address")
        if label[:2].lower() == "0x":
            values.append(int(label[2:] or "0", 16))
        elif len(label) > 1 and label[0] == "0":
            if not set(label) <= set("01234567"):
                raise URLRefused(
                    _display(url), "malformed", f"{host!r} is not a valid IPv4 address (octal)"
                )
            values.append(int(label, 8))
        else:
            values.append(int(label))
    *head, last = values
    if len(values) > 4 or any(v > 255 for v in head) or last >= 256 ** (5 - len(values)):
        raise URLRefused(_display(url), "malformed", f"{host!r} is not a valid IPv4 address")
    number = last
    for i, v in enumerate(head):
        number += v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def _resolve(url: str, host: str, port: int, resolve: Resolver) -> list[IPAddress]:
    if not _NAME.match(host) or len(host) > 254:
        raise URLRefused(_display(url), "malformed", f"{host!r} is not a valid host name")
    try:
        answers = resolve(host, port)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"target URL {_display(url)}: cannot resolve {host}: {exc}") from exc
    if not answers:
        raise ConfigError(f"target URL {_display(url)}: {host} resolves to no address")
    addresses: list[IPAddress] = []
    for answer in answers:
        try:
            addresses.append(ipaddress.ip_address(answer.split("%", 1)[0]))
        except ValueError as exc:
            raise ConfigError(
                f"target URL {_display(url)}: resolver gave {answer!r} for {host}: {exc}"
            ) from exc
    return addresses


def _mapped(address: IPAddress) -> ipaddress.IPv4Address | None:
    return address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None


def _effective(address: IPAddress) -> tuple[IPAddress, str]:
    """The address that decides (the IPv4 inside a mapped/NAT64/6to4 one) and how it was met."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped, f" (as ::ffff:{address.ipv4_mapped})"
        inner = address.sixtofour
        if inner is None and address in _NAT64:
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:
            return inner, f" (as {address})"
    return address, ""


def address_kind(address: IPAddress) -> str | None:
    """The refused kind of an address ("loopback", …, "cloud-metadata"), None if public."""
    effective, _ = _effective(address)
    if effective in METADATA_ADDRESSES:
        return "cloud-metadata"
    for kind, networks in _KINDS:
        if any(effective in net for net in networks if net.version == effective.version):
            return kind
    if effective.is_reserved or not effective.is_global:
        return "reserved"
    return None


def _judge(
    url: str,
    address: IPAddress,
    networks: tuple[IPNetwork, ...],
    *,
    name: str | None,
    spelling: str | None,
) -> None:
    kind = address_kind(address)
    if kind is None:
        return
    effective, via = _effective(address)
    seen = f"{effective}{via}"
    if spelling is not None:
        seen += f" (written {spelling!r})"
    if name is not None:
        seen += f" (from {name})"
    if kind == "cloud-metadata":
        raise URLRefused(
            _display(url),
            kind,
            f"cloud-metadata address {seen} is never allowed, not even allowlisted",
        )
    if any(effective in net for net in networks if net.version == effective.version):
        return
    cidr = f"{effective}/{effective.max_prefixlen}"
    hint = f"allowlist it with {ALLOW_FLAG} {cidr} or {ALLOW_SETTING}"
    if spelling is not None:
        hint = f"write it as {effective} and {hint}"
    raise URLRefused(_display(url), kind, f"{kind} address {seen} not allowed ({hint})")


def _origin(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in SCHEMES or not parts.hostname or "@" in parts.netloc:
        return None
    return parts.scheme, parts.hostname, DEFAULT_PORTS[parts.scheme] if port is None else port


def _display(url: str) -> str:
    """The URL for a message: any userinfo (a password) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.rpartition("@")[2] if "@" in url else url
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
