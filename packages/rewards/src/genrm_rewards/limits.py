"""Every time limit of genrm-rewards, written once: the other modules import them from here.

The judge calls have none of their own: a call's deadline and retries are the client's
(``genrm_client``), whose ``GenRMError`` after them is a ``judge_error``. What this package
times itself is math-verify, which runs on a small thread pool under ``asyncio.wait_for``
because its own signal-based timeouts cannot run off the main thread (``rules``).
"""

from __future__ import annotations

from typing import Final

#: The default ``rule_timeout_s`` (``RewardArgs``): one math-verify check, gate or ``math``.
RULE_TIMEOUT_S: Final = 5.0
#: The first import of math-verify (and sympy), once per process, off the event loop: seconds on
#: a loaded machine. It is waited for apart from a check's ``rule_timeout_s``, which it must not
#: use up, and bounded so that an import stuck on a broken install fails the call instead of
#: hanging it.
MATH_VERIFY_IMPORT_TIMEOUT_S: Final = 120.0
