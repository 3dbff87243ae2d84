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
    """``(offset, count)`` of a run's samples in its input set, or ``None`` when the set cannot be opened again
    or the samples are not one stretch of it."""
    names = recorded.get("names")
    if not isinstance(names, list):
        return None
    try:
        whole = reopen_recorded(recorded)
    except QconsistError:
        return None
    return stretch(list(whole.names), names)
