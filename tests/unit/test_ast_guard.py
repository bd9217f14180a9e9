"""tests/support/ast_guard.py: a parse during which a collection runs a finalizer that parses too
(as a traceback formatted in a finalizer does on 3.11) returns its tree, and the finalizers still
run, after it (unguarded, CPython 3.11.7 raises `SystemError: AST constructor recursion depth
mismatch` on the same scenario). Each case runs in a fresh interpreter: pytest's own collections and the guard this
process installed (tests/conftest.py) would decide when the finalizers run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[1]

SCENARIO = """
import ast, gc, sys
sys.path.insert(0, {support!r})
from support import ast_guard
if {guarded}:
    ast_guard.install()

ran = []
class ParsesWhenCollected:   # cyclic garbage whose finalizer parses from deeper in the stack
    def __init__(self):
        self.me = self
    def __del__(self):
        def deeper(n):
            return deeper(n - 1) if n else ast.parse("x = (1, 2)")
        ran.append(1)
        deeper(20)

source = "\\n".join(f"y{{i}} = [a for a in range({{i}})]" for i in range(200))
gc.disable()
for _ in range(50):
    ParsesWhenCollected()
gc.enable()
gc.set_threshold(1)   # a collection at the next allocation: inside the parse
try:
    print("statements", len(ast.parse(source).body))
except SystemError as e:
    print("SystemError", e)
gc.set_threshold(700, 10, 10)
gc.collect()
print("finalizers", len(ran))
"""


def scenario(guarded: bool) -> str:
    r = subprocess.run([sys.executable, "-c", SCENARIO.format(support=str(SUPPORT), guarded=guarded)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_parse_that_a_collection_would_interrupt_returns_its_tree():
    assert scenario(guarded=True).split("\n")[:2] == ["statements 200", "finalizers 50"]

