"""Tag subscription expressions: "*" (or empty) for every tag, or "TagA || TagB"."""

from __future__ import annotations


class TagExpressionError(ValueError):
    pass


def parse_tags(expression: str) -> frozenset[str] | None:
    """The set of tags an expression selects, or None for all. Raises TagExpressionError."""
    expr = expression.strip()
    if expr in ("", "*"):
        return None
    tags = [t.strip() for t in expr.split("||")]
    if any(not t for t in tags):
        raise TagExpressionError(f"invalid tag expression {expression!r}: use \"*\" or \"TagA || TagB\"")
    for t in tags:
        if "|" in t or "*" in t or any(c.isspace() for c in t):
            raise TagExpressionError(f"invalid tag {t!r} in expression {expression!r}")
    return frozenset(tags)
