"""Typed decoders used from many threads at once, each process's first use of every admin answer
Struct, the answers that hold others first: the client's decoders (client/admin.py,
protocol/bodies.py) are made whole before any thread decodes, so no process dies. msgspec 0.22 decoding a Struct's first use from several threads
at once dies of SIGSEGV in about one process in three (the console's and the operator's crashes on
a loaded host); ten fresh processes here all finish."""

from __future__ import annotations

import subprocess
import sys

RACE = """
import sys, threading
import msgspec
sys.setswitchinterval(1e-6)   # a thread switch wherever one can happen
from txbroker.client.admin import _json_decoder
from txbroker.protocol import admin as answers, bodies
structs = [t for t in reversed(list(vars(answers).values()))
           if isinstance(t, type) and issubclass(t, msgspec.Struct) and t.__module__ == answers.__name__]
start = threading.Barrier(8)

def first_uses():
    start.wait()
    for t in structs:
        every_field = msgspec.json.encode({f: None for f in t.__struct_fields__})
        for decode in (_json_decoder(t).decode, lambda raw: bodies.decode(t, msgspec.msgpack.encode(msgspec.json.decode(raw)))):
            try:
                decode(every_field)
            except msgspec.ValidationError:
                pass

threads = [threading.Thread(target=first_uses) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(structs), "structs")
"""


def test_first_decodes_from_eight_threads_never_crash_the_process():
    for attempt in range(10):
        r = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"attempt {attempt}: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert int(r.stdout.split()[0]) >= 20, r.stdout
