"""The fuzzing corpus (tests/fuzz/corpus/) replayed through both harnesses on every `make test`,
and a few seconds of real coverage-guided fuzzing (atheris) as a smoke test of the harnesses.
The long runs are a separate command: tests/fuzz/README.md."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parent.parent / "fuzz"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, FUZZ / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(FUZZ))
    spec.loader.exec_module(module)
    return module


def corpus(kind: str) -> list[Path]:
    return sorted((FUZZ / "corpus" / kind).iterdir())


def test_frames_corpus_replays_cleanly():
    harness = load("fuzz_frames")
    files = corpus("frames")
    assert len(files) >= 40
    for f in files:
        harness.TestOneInput(f.read_bytes())


def test_handlers_corpus_replays_cleanly():
    harness = load("fuzz_handlers")
    files = corpus("handlers")
    assert len(files) >= 40
    try:
        for f in files:
            harness.TestOneInput(f.read_bytes())
    finally:
        harness.close()


@pytest.mark.parametrize("name,runs", [("fuzz_frames", 2000), ("fuzz_handlers", 200)])
def test_atheris_smoke(name, runs, tmp_path):
    pytest.importorskip("atheris")
    r = subprocess.run([sys.executable, str(FUZZ / f"{name}.py"), str(tmp_path), str(FUZZ / "corpus" / name[5:]),
                        f"-atheris_runs={runs}", f"-artifact_prefix={tmp_path}/"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"Done {runs}" in r.stderr
