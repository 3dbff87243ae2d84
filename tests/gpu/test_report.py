"""LocateReport: JSON round trip of a real CPU exploration, and the terminal rendering."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from qconsist.cli.locate import render
from qconsist.errors import RunStoreError
from qconsist.locate.config import Tf32Override
from qconsist.locate.report import SCHEMA, LocateReport, Tf32Section, sensitive_nodes
from qconsist.store.serde import dumps, encode, loads


@pytest.fixture(scope="module")
def report(cpu_threads_exploration) -> LocateReport:
    e = cpu_threads_exploration
    return LocateReport(
        model={"name": "open_nsfw", "path": "quantize/model.onnx"}, inputs={"count": 2}, device={"name": "CPU"},
        reference="threads=1", repeats=2, contention=None, configs=e["reports"], comparisons=e["results"],
        tf32=Tf32Section(Tf32Override(None)), recommendation=e["decision"],
        nodes=sensitive_nodes(e["tagged"]),
    )


def test_round_trip(report):
    data = loads(dumps(report))
    assert data["schema"] == SCHEMA
    again = LocateReport.from_json(data)
    assert encode(again) == encode(report)
    assert again.passed == report.passed is True


def test_schema_is_checked(report):
    data = report.to_json()
    with pytest.raises(RunStoreError, match=r"not a locate report \(schema 'qconsist.locate/0', expected 'qconsist.locate/1'\)"):
        LocateReport.from_json({**data, "schema": "qconsist.locate/0"})
    del data["configs"]
    with pytest.raises(RunStoreError, match="locate report is missing or has an invalid field: 'configs'"):
        LocateReport.from_json(data)


def test_rendering_reads_like_the_investigation(report):
    buffer = io.StringIO()
    render(report, Console(file=buffer, width=200, no_color=True, highlight=False))
    text = buffer.getvalue()
    first = report.comparisons[0].first_node
    assert "qconsist locate: open_nsfw (quantize/model.onnx), 2 inputs, on CPU" in text
    assert "2/2 identical" in text
    assert "threads=1 vs threads=3" in text and first in text
    assert "Origin nodes: outputs differ while all inputs are bit-identical" in text
    assert "recommendation: cudnn_conv_algo_search=" in text
    # the configurations were timed side by side (5 rounds): the cost is the median of the paired ratios
    rec = report.recommendation
    assert rec.paired is not None and rec.paired.rounds == 5 and rec.cost == rec.paired.median
    assert f"{rec.cost:.2f}x the fastest ({rec.fastest} {rec.fastest_ms:.2f} ms) by the median of 5 rounds timed side by side;" in text
    assert [report.cost(c.label) for c in report.configs if c.label == rec.fastest] == [1.0]
    assert "Latency per config (ms, batch 1)" in text
