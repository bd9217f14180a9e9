"""The fault harness's summaries over whole result directories (chaos/__main__.py `summary`,
chaos/k8s/__main__.py `write_summary`): the node's reports record their code as a bare commit, the
local ones as {commit, modified}; both must summarize."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from chaos.__main__ import summary
from chaos.k8s.__main__ import write_summary

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_the_node_run_summarizes_with_the_commit_it_ran_on(tmp_path):
    for seed in (41, 42):
        shutil.copy(RESULTS / "chaos-k8s-20261128-final" / f"seed-{seed}.json", tmp_path)
    assert write_summary(tmp_path, [41, 42], 90.0) == 0          # both clean
    text = (tmp_path / "summary.txt").read_text()
    assert "code: 192937d (2 schedules)" in text


def test_a_local_report_names_its_code_and_whether_it_was_modified():
    report = json.loads((RESULTS / "chaos-20261128-newchecks" / "seed-709.json").read_text())
    modified = dict(report, code={"commit": "abc1234", "modified": True})
    assert "code: abc1234 (modified) (1 schedules), fbb22e7 (1 schedules)" in summary([modified, report])
