"""Web origins (``scheme://host[:port]``), as browsers send them in ``Origin`` and ``Referer``.

Pure functions: the admin routes compare a request's origin with the application's own and
with the trusted ones (``ekbatan.jobs.admin-trusted-origins``), which the settings validate
with ``parse_origin``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["origin_of", "parse_origin"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str | None:
    """The normalized origin of ``url`` (lower-case scheme and host, the default port left
    out), or None for what names no origin: ``null`` (a sandboxed page, a form sent under
    ``Referrer-Policy: no-referrer``), a scheme other than http(s), or no host."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:  # a port that is no number, a bracket that does not close
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    if ":" in host:  # IPv6, as browsers write it
        host = f"[{host}]"
    shown_port = "" if port is None or port == _DEFAULT_PORTS[scheme] else f":{port}"
    return f"{scheme}://{host}{shown_port}"


def parse_origin(value: str) -> str:
    """A trusted origin as configured: ``https://jobs.example.com`` or ``http://host:8080``,
    without path, query or user; ValueError naming the value and the form otherwise."""
    text = value.strip()
    origin = origin_of(text)
    parts = urlsplit(text) if origin is not None else None
    if parts is None or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(
            f"{value!r} is not an origin: write scheme://host[:port] (http or https, no path), "
            "e.g. https://jobs.example.com"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{origin!r}: an origin has no user or password; leave them out")
    assert origin is not None
    return origin
