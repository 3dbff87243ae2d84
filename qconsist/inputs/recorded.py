"""An input set as a run's manifest records it (source, preprocessing, sample names), opened again."""

from __future__ import annotations

from typing import Any

from qconsist.errors import InputError, QconsistError
from qconsist.inputs.inputset import InputSet, open_input_set
from qconsist.inputs.preprocess import Preprocess


def reopen_recorded(recorded: dict[str, Any], input_name: str = "input") -> InputSet:
    """The whole input set a manifest's ``inputs`` section names, prepared as it records; ``InputError``
    when it cannot be opened."""
    source, preprocess = recorded.get("source"), recorded.get("preprocess")
    if not source:
        raise InputError("the run does not record its input set")
    return open_input_set(source, Preprocess.from_dict(preprocess, where="run manifest preprocess")
                          if isinstance(preprocess, dict) else None, input_name)


def stretch(whole: list[str], names: list[str]) -> tuple[int, int] | None:
    """Where ``names`` lie in ``whole`` as ``(offset, count)``, when they are one stretch of it, in order."""
    position = {name: index for index, name in enumerate(whole)}
    if not names or any(n not in position for n in names):
        return None
    first = position[names[0]]
    return (first, len(names)) if [position[n] for n in names] == list(range(first, first + len(names))) else None


def recorded_subset(recorded: dict[str, Any]) -> tuple[int, int] | None:
    """``(offset, count)`` of a run's samples in its input set: as recorded (``offset``, ``count``), or for a run
    recorded before its offset, where its sample names lie in the set opened again (``None`` when it cannot be
    opened or they are not one stretch of it)."""
    offset, count = recorded.get("offset"), recorded.get("count")
    if _whole(offset) and _whole(count) and count > 0:
        return offset, count
    names = recorded.get("names")
    if not isinstance(names, list):
        return None
    try:
        whole = reopen_recorded(recorded)
    except QconsistError:
        return None
    return stretch(list(whole.names), names)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
