"""Git's rules for branch and tag names (`git check-ref-format`), which the Hub applies to revisions.

A revision also becomes a file name in the Hugging Face cache (`refs/<revision>`), so a name these
rules refuse, such as one holding `..`, could write outside the cache. One check, used wherever a
revision enters: `vitzoo.hub.transport` (references, `revision=`, `--revision`) and the test Hub server.
"""

from __future__ import annotations

FORBIDDEN = " ~^:?*[\\"


def problem(name: object) -> str | None:
    """Why `name` is not a valid git ref name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "it is empty" if name == "" else f"it is not text ({type(name).__name__})"
    bad = sorted({c for c in name if ord(c) < 0x20 or ord(c) == 0x7F or c in FORBIDDEN})
    if bad:
        return f"it holds {', '.join(map(repr, bad))} (no spaces, control characters or any of {FORBIDDEN!r})"
    for needle in ("..", "@{", "//"):
        if needle in name:
            return f"it holds {needle!r}"
    if name == "@" or name.startswith("/") or name.endswith(("/", ".")):
        return "it is '@', begins with '/' or ends with '/' or '.'"
    for part in name.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f"its part {part!r} begins with '.' or ends with '.lock'"
    return None
