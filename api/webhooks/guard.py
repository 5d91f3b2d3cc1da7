"""Where webhooks may go: tenant-given URLs are hostile (server-side request forgery).

A webhook URL is refused, at registration and again at every delivery, when its host is or
resolves to an address that is not public: loopback, private (RFC 1918, IPv6 unique local),
link-local (169.254.0.0/16, the cloud metadata services' home), shared (100.64.0.0/10),
multicast, reserved or unspecified, IPv4 hidden in IPv6 included. The operator may allow
networks (`BRORL_WEBHOOK_ALLOWED_NETWORKS`, CIDRs, e.g. a receiver on 127.0.0.1 in a test).

At delivery the check and the connection use the same resolution: `GuardedTransport`'s
network backend resolves the host, refuses a non-public address, and connects to the address
it checked (TLS still verifies the host name), so a DNS answer that changes between the
check and the connection (rebinding) cannot reach inside. No proxy from the environment is
used (it would connect on the URL's behalf), and redirects are not followed.

Each delivery has a hard total deadline (`deadline`): httpx's timeouts are per phase (a
receiver that trickles its answer a byte at a time resets the read timeout at every byte and
could hold the dispatcher for ever), so every socket operation of the guarded streams waits at
most until the deadline, and none starts after it. DNS resolution is left to the system
resolver's own timeouts.
"""
from __future__ import annotations

import ipaddress
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Iterable
from urllib.parse import urlsplit

import httpcore
import httpx

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_URL = 2000


class Forbidden(ValueError):
    """The URL or the address it resolves to is not one webhooks may reach."""


def parse_networks(text: str) -> list[Network]:
    """`BRORL_WEBHOOK_ALLOWED_NETWORKS`: comma-separated CIDRs; ValueError naming a bad one."""
    nets = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            nets.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"BRORL_WEBHOOK_ALLOWED_NETWORKS: {part!r} is not a network (CIDR)") from None
    return nets


NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _carried(addr: ipaddress.IPv4Address | ipaddress.IPv6Address):
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), else the address itself."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped or addr.sixtofour:
            return addr.ipv4_mapped or addr.sixtofour
        if addr in NAT64:
            return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr


def address_problem(ip: str, allowed: Iterable[Network] = ()) -> str | None:
    """Why webhooks may not reach `ip`, or None."""
    addr = _carried(ipaddress.ip_address(ip.split("%")[0]))
    if any(addr in net for net in allowed):
        return None
    if addr.is_global and not addr.is_multicast:
        return None
    return f"{addr}, which is not a public address (loopback, private, link-local or reserved)"


def resolve(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise Forbidden(f"{host} does not resolve ({exc.strerror})") from None
    return list(dict.fromkeys(info[4][0] for info in infos))


def checked_addresses(host: str, port: int, allowed: Iterable[Network]) -> list[str]:
    """`host`'s addresses, all of them allowed; Forbidden naming the first that is not."""
    allowed = list(allowed)
    addresses = resolve(host, port)
    for ip in addresses:
        if (problem := address_problem(ip, allowed)) is not None:
            raise Forbidden(f"{host} resolves to {problem}")
    return addresses


def url_problem(url: str, allowed: Iterable[Network], resolve_host: bool = True) -> str | None:
    """Why `url` cannot be a webhook endpoint, or None."""
    if len(url) > MAX_URL:
        return f"at most {MAX_URL} characters"
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http"):
        return "must be an http:// or https:// URL"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user name or password (sign with the endpoint's secret instead)"
    if not parts.hostname:
        return "has no host"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "has an invalid port"
    if resolve_host:
        try:
            checked_addresses(parts.hostname, port, allowed)
        except Forbidden as exc:
            return str(exc)
    return None


_deadline = threading.local()  # the dispatcher's thread sends one delivery at a time


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Guarded streams of this thread end every wait by `seconds` from now."""
    _deadline.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline.at = None


def _within(timeout: float | None, late: type[Exception]) -> float | None:
    """`timeout` shortened to what is left before this thread's deadline; `late` past it."""
    at = getattr(_deadline, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise late("the delivery's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake ends by the deadline (a
    socket's timeout bounds one recv, which a trickled byte satisfies; CPython's handshake
    treats it as a total)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, _within(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _within(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _DeadlineStream(self.inner.start_tls(ssl_context, server_hostname,
                                                    _within(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _GuardedBackend(httpcore.SyncBackend):
    """Connects only to checked addresses, to the address it checked, on deadline streams."""

    def __init__(self, allowed: list[Network]) -> None:
        self.allowed = allowed

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        last: Exception | None = None
        for ip in checked_addresses(host, port, self.allowed):
            try:
                return _DeadlineStream(super().connect_tcp(ip, port, _within(timeout, httpcore.ConnectTimeout),
                                                           local_address, socket_options))
            except httpcore.ConnectError as exc:  # the next address of the host
                last = exc
        raise last or httpcore.ConnectError(f"cannot connect to {host}")


class GuardedTransport(httpx.HTTPTransport):
    """httpx's transport over the guarded backend, ignoring proxy variables."""

    def __init__(self, allowed: list[Network]) -> None:
        super().__init__(trust_env=False, retries=0)
        # httpx builds its connection pool without a backend argument; the pool it makes
        # is replaced by the same pool on the guarded backend (tests exercise this path).
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), max_connections=20,
                                             network_backend=_GuardedBackend(allowed))


def guarded_client(allowed: list[Network], timeout_s: float) -> httpx.Client:
    return httpx.Client(transport=GuardedTransport(allowed), timeout=timeout_s, follow_redirects=False,
                        trust_env=False)
