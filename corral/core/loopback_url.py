"""A page of a loopback preview (seed 004 V1.1 §3): ``http://<loopback IP>:<port>/path``.

Judged after parsing, never by the spelling: the host must be an IP literal on the
loopback network (a name could resolve anywhere), the scheme plain http, the port
explicit, and nothing may ride along (credentials, a fragment, a backslash that a
browser reads as a slash, control characters). Used by the spec's
``[project] preview_url`` and by ``preview.validate``, so both judge alike.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

MAX_URL_CHARS = 600


class NotLoopback(ValueError):
    """The text is not a page of a loopback preview; the message says why."""


#: The one host a preview may have.
PREVIEW_HOST = ipaddress.ip_address("127.0.0.1")


def loopback_page(url: str) -> str:
    """The URL, unchanged, if it is a page of a loopback http server; else NotLoopback."""
    if len(url) > MAX_URL_CHARS or not url.isprintable() or any(ch in url for ch in "\\# "):
        raise NotLoopback(f"at most {MAX_URL_CHARS} printable characters, no '\\', '#' or spaces")
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise NotLoopback("the scheme must be http")
    try:
        host = ipaddress.ip_address(parts.hostname or "")
        port = parts.port
    except ValueError:
        raise NotLoopback("the host must be 127.0.0.1 with a port") from None
    if host != PREVIEW_HOST:
        # Seed 004 V1.1 §3: "仅允许精确 http://127.0.0.1:<port> 预览 origin": not another
        # loopback address (127.0.0.2, [::1]), which the browser's exact bypass would not cover.
        raise NotLoopback(f"{host} is not 127.0.0.1: a preview is served on exactly 127.0.0.1")
    if port is None:
        raise NotLoopback("the port must be given")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise NotLoopback("no credentials in the URL")
    if parts.path and not parts.path.startswith("/"):
        raise NotLoopback("the path must start with '/'")
    return url


def origin_of(url: str) -> str:
    """``http://host:port`` of a URL loopback_page accepted."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
