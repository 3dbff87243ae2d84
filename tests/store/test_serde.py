"""store/serde: a result declared once with ``@serialized`` is written and read by the one serializer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from qconsist.compare import TensorStats
from qconsist.compare.output import OutputEffect
from qconsist.errors import RunStoreError
from qconsist.locate.decision import ConfigOutcome, recommend
from qconsist.store.serde import dumps, loads, serialized, structure


@serialized
@dataclass(frozen=True)
class Part:
    name: str
    scale: float

    @property
    def doubled(self) -> float:
        return 2 * self.scale


def _older(data: dict) -> dict:
    return {"count": len(data["items"]), **data}


@serialized(
    schema="test.whole/2", derived=("passed", "part.doubled", "summary"), renames={"old_name": "name"}, upgrade=_older,
    error=RunStoreError, refused="not a whole (schema {found!r}, expected {schema!r})", malformed="whole is broken: {exc}",
)
@dataclass
class Whole:
    name: str
    part: Part
    items: tuple[int, ...]
    count: int
    by_index: dict[int, str] = field(default_factory=dict)
    note: str | None = None

    @property
    def passed(self) -> bool:
        return self.count > 0

    def summary(self) -> str:
        return f"{self.name}: {self.count}"


def _whole() -> Whole:
    return Whole("w", Part("p", math.inf), (3, 1), 2, {7: "seven"})


def test_fields_then_derived_figures_and_a_round_trip():
    data = loads(dumps(_whole()))
    assert list(data) == ["schema", "name", "part", "items", "count", "by_index", "note", "passed", "doubled", "summary"]
    assert data["schema"] == "test.whole/2" and data["passed"] is True and data["summary"] == "w: 2"
    assert data["doubled"] == math.inf and data["part"] == {"name": "p", "scale": math.inf}
    assert data["by_index"] == {"7": "seven"} and data["items"] == [3, 1]
    again = Whole.from_json(data)
    assert again == _whole() and again.by_index == {7: "seven"}  # keys back to int, tuples back, inf back


def test_older_records_are_renamed_and_upgraded():
    old = {"schema": "test.whole/2", "old_name": "before", "part": {"name": "p", "scale": 1}, "items": [1, 2, 3]}
    whole = Whole.from_json(old)
    assert (whole.name, whole.count, whole.part.scale) == ("before", 3, 1.0)
    both = Whole.from_json({**old, "name": "now", "count": 1})  # the current key wins over the old one
    assert (both.name, both.count) == ("now", 1)


def test_a_record_of_another_schema_or_kind_is_refused():
    with pytest.raises(RunStoreError, match=r"^not a whole \(schema 'test.whole/1', expected 'test.whole/2'\)$"):
        Whole.from_json({**_whole().to_json(), "schema": "test.whole/1"})
    with pytest.raises(RunStoreError, match=r"^not a whole \(schema 'list', expected 'test.whole/2'\)$"):
        Whole.from_json([1, 2])


def test_a_malformed_record_says_which_field():
    data = _whole().to_json()
    del data["part"]
    with pytest.raises(RunStoreError, match=r"^whole is broken: 'part'$"):
        Whole.from_json(data)
    with pytest.raises(RunStoreError, match=r"^whole is broken: expected str, got 5$"):
        Whole.from_json({**_whole().to_json(), "name": 5})
    with pytest.raises(RunStoreError, match=r"^whole is broken: 3 is none of str$"):
        Whole.from_json({**_whole().to_json(), "note": 3})


def test_a_part_without_a_schema_raises_the_plain_error():
    with pytest.raises(KeyError, match="scale"):
        Part.from_json({"name": "p"})
    with pytest.raises(KeyError, match="scale"):
        structure(Part, {"name": "p"})


def test_real_results_read_their_older_records():
    stats = TensorStats.from_json({"tensor": "conv1", "total": 10, "differing": 4, "max_abs": None, "max_rel": 0.5})
    assert (stats.name, stats.elements, stats.mismatched, stats.percent) == ("conv1", 10, 4, 40.0)
    assert math.isnan(stats.max_abs)
    effect = OutputEffect.from_json({"samples": 3, "greatest_abs": 0.0, "top1_agree": 3, "outputs_identical": False})
    assert effect.identical is False and effect.top1_agreement == 1.0


def test_a_recommendation_round_trips_with_its_verdict():
    outcomes = [ConfigOutcome("EXHAUSTIVE/tf32=0", True, 2.3, True, False), ConfigOutcome("HEURISTIC/tf32=1", False, 2.0, False, False)]
    recommendation = recommend(outcomes, max_cost=1.15)
    data = loads(dumps(recommendation))
    assert data["accepted"] is True and data["config"] == "EXHAUSTIVE/tf32=0" and data["stable_configs"] == ["EXHAUSTIVE/tf32=0"]
    assert type(recommendation).from_json(data) == recommendation
