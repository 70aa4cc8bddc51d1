"""The options calls take: connection options, E2B's accepted-and-ignored ones, and create's params."""
from typing import Any, Dict, Optional, Tuple

from ._wire import seconds
from .exceptions import InvalidArgumentException

#: Default lifetime of a sandbox, as E2B: 300 seconds.
DEFAULT_SANDBOX_TIMEOUT = 300
#: E2B's connection options that mean nothing to a local daemon: accepted and ignored.
IGNORED = ("api_key", "access_token", "domain", "debug", "headers", "proxy", "logger")


def connection_opts(opts: Dict[str, Any], what: str) -> Dict[str, Any]:
    """``socket`` and ``request_timeout`` of opts; E2B's other options ignored, anything else refused."""
    out: Dict[str, Any] = {}
    for k, v in opts.items():
        if k == "socket":
            if v is not None and not isinstance(v, str):
                raise InvalidArgumentException(f"{what}: socket must be a path")
            out["socket"] = v
        elif k == "request_timeout":
            if v is not None:
                out["request_timeout"] = v
        elif k not in IGNORED:
            raise InvalidArgumentException(f"{what}: unknown option {k!r}")
    return out


def create_params(
    template: Optional[str], timeout: Optional[float], metadata: Optional[Dict[str, str]], envs: Optional[Dict[str, str]],
    allow_internet_access: bool, network: Any, mcp: Any, backend: Optional[str], cwd: Optional[str],
    limits: Optional[Dict[str, Any]], accel: Optional[str] = None,
) -> Dict[str, Any]:
    """The params of sandbox.create for Sandbox.create's arguments."""
    if mcp is not None:
        raise InvalidArgumentException("Sandbox.create: mcp is not supported by tupper")
    t = seconds(DEFAULT_SANDBOX_TIMEOUT if timeout is None else timeout, "Sandbox.create")
    lim: Dict[str, Any] = dict(limits or {})
    lim["timeout"] = t
    params: Dict[str, Any] = {"limits": lim}
    if template is not None:
        if not isinstance(template, str) or template == "":
            raise InvalidArgumentException("Sandbox.create: template must be an image name")
        params["image"] = template
    for name, value in (("metadata", metadata), ("envs", envs)):
        if value is not None and (not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in value.items())):
            raise InvalidArgumentException(f"Sandbox.create: {name} must be a dict of strings")
    if metadata is not None:
        params["metadata"] = metadata
    if envs is not None:
        params["env"] = envs
    if network is not None:
        params["network"] = network
    elif allow_internet_access is False:
        params["network"] = "none"
    if backend is not None:
        params["backend"] = backend
    if cwd is not None:
        params["cwd"] = cwd
    if accel is not None:
        if accel not in ("kvm", "tcg", "auto"):
            raise InvalidArgumentException("Sandbox.create: accel must be 'kvm', 'tcg' or 'auto'")
        params["accel"] = accel
    return params


def split_opts(opts: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(connection options, the rest) of opts."""
    conn = {k: v for k, v in opts.items() if k in ("socket", "request_timeout") or k in IGNORED}
    rest = {k: v for k, v in opts.items() if k not in conn}
    return conn, rest
