"""A pytest plugin that writes each test's outcome to a JSON file as the run goes (the device check's tests part:
a run cut short by its timeout keeps every test that finished).

    python -m pytest -p pytest_json --results-json out.json tests/...   (benchmarks/ on PYTHONPATH)

The file: ``{"tests": {nodeid: {"outcome": passed|failed|skipped|error, "seconds": float, "message": str}},
"counts": {outcome: n}, "complete": bool, "exit_status": int | null}``; ``message`` is the skip reason or the
failure's last lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

_MESSAGE_CHARS = 2000  # the end of a failure's report: the assertion and its values


class JsonResults:
    def __init__(self, path: Path):
        self.path, self.tests, self.exit_status = path, {}, None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self.tests.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0, "message": ""})
        test["seconds"] += report.duration
        if report.when == "call" and not report.skipped:
            test["outcome"] = report.outcome
        elif report.skipped:
            test["outcome"] = "skipped"
        elif report.failed:  # a setup or teardown failure
            test["outcome"] = "error"
        if report.skipped and isinstance(report.longrepr, tuple):
            test["message"] = str(report.longrepr[2])
        elif report.failed:
            test["message"] = report.longreprtext[-_MESSAGE_CHARS:]
        self.write(complete=False)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.exit_status = int(exitstatus)
        self.write(complete=True)

    def write(self, complete: bool) -> None:
        counts: dict[str, int] = {}
        for test in self.tests.values():
            counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
        report = {"tests": self.tests, "counts": counts, "complete": complete, "exit_status": self.exit_status}
        self.path.write_text(json.dumps(report, indent=2) + "\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--results-json", type=Path, default=None, help="write each test's outcome here as it goes")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--results-json")
    if path is not None:
        config.pluginmanager.register(JsonResults(path), "json-results")
