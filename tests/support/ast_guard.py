"""`ast.parse` kept from running inside itself, for pytest's failure reports.

CPython 3.11's AST constructor keeps its recursion depth in module state, and when a garbage
collection that `ast.parse` triggers runs a finalizer that formats a traceback (3.11's traceback
module parses each line for its carets; pytest's hook for unraisable exceptions formats them),
the nested parse leaves that depth where it ended: the outer parse then raises
`SystemError: AST constructor recursion depth mismatch`. Inside pytest's report of a failing test
that is an INTERNALERROR, and under xdist the worker dies with the failure unseen (CI stop 42, the
console's browser test, whose playwright and asyncio objects are collected with exceptions pending).

No collection runs during a guarded parse, so no finalizer can parse inside it."""

from __future__ import annotations

import ast
import functools
import gc


def guarded(parse):
    @functools.wraps(parse)
    def parse_without_collecting(*args, **kwargs):
        enabled = gc.isenabled()
        gc.disable()
        try:
            return parse(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    parse_without_collecting.__wrapped_parse__ = parse
    return parse_without_collecting


def install() -> None:
    if not hasattr(ast.parse, "__wrapped_parse__"):
        ast.parse = guarded(ast.parse)
