"""What the modules of one Sandbox object share: its id, its connection, its accounts."""
from typing import Any, Dict, Optional

from ._wire import Account
from .exceptions import TimeoutException


class Link:
    """One sandbox as one Sandbox object reaches it."""

    def __init__(self, sandbox_id: str, conn: Any, info: Dict[str, Any]) -> None:
        self.sandbox_id = sandbox_id
        self.conn = conn
        self.acct = Account(info)
        self.killed = False

    def params(self, **kw: Any) -> Dict[str, Any]:
        """kw with this sandbox's id as ``sandbox``."""
        kw["sandbox"] = self.sandbox_id
        return kw


def gone(sandbox_id: str, why: str) -> TimeoutException:
    """The error of a call cut short because its sandbox went away, as E2B words it."""
    return TimeoutException(
        f"sandbox {sandbox_id} is gone ({why}): it was killed or its lifetime ran out. "
        "You can modify the sandbox timeout by passing 'timeout' when starting the sandbox "
        "or calling '.set_timeout' on the sandbox with the desired timeout."
    )


def rt(request_timeout: Optional[float]) -> Any:
    """The timeout argument of a call: the connection's default unless the caller gave one."""
    return "default" if request_timeout is None else request_timeout
