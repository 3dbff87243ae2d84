"""The inputs a run was made on, opened again from its manifest and checked against its digest."""

from __future__ import annotations

from pathlib import Path

from qconsist.errors import InputError, RunStoreError
from qconsist.inference.session import input_specs
from qconsist.inputs import InputSet
from qconsist.inputs.digest import digest_kind
from qconsist.inputs.recorded import recorded_subset, reopen_recorded, stretch
from qconsist.store.run import Run


def replay_inputs(run: Run, model: Path) -> tuple[InputSet, tuple[int, int] | None]:
    """The samples of ``run``'s input set (its source, preprocessing and the stretch of it the run read,
    or for an old run its sample names), in its order, fitted to ``model``'s inputs, and where they lie in the
    whole set (offset, count) when they are one stretch of it; ``RunStoreError`` when they cannot be found again
    or their bytes differ from the run's (its digest, of the kind the run recorded)."""
    return replay_recorded(run.manifest.inputs, model, run.path)


def replay_recorded(recorded: dict, model: Path, run_dir: Path) -> tuple[InputSet, tuple[int, int] | None]:
    """``replay_inputs`` of one recorded input set (a manifest's ``inputs``, or one role of a pipeline's)."""
    source, names, digest = recorded.get("source"), recorded.get("names"), recorded.get("digest")
    stretch_recorded = recorded_subset(recorded) if "offset" in recorded else None
    kind = digest_kind(digest)
    if not source or kind is None or (stretch_recorded is None and not isinstance(names, list)):
        raise RunStoreError(f"run {run_dir} does not record its input set; give `inputs`")
    specs = input_specs(model)
    try:
        opened = reopen_recorded(recorded, specs[0].name if specs else "input")
    except InputError as exc:
        raise RunStoreError(f"cannot open the input set of run {run_dir} again ({exc.message}); give `inputs`") from None
    if stretch_recorded is not None:
        offset, count = stretch_recorded
        if offset + count > len(opened):
            raise RunStoreError(f"the input set {source} no longer holds samples {offset}..{offset + count - 1} of run "
                                f"{run_dir} (it has {len(opened)}); give `inputs`")
        chosen, where = opened.subset(offset, count), stretch_recorded
    else:
        position = {name: index for index, name in enumerate(opened.names)}
        missing = [n for n in names if n not in position]
        if missing:
            raise RunStoreError(f"the input set {source} no longer holds sample {missing[0]!r} of run {run_dir}; give `inputs`")
        chosen, where = opened.picked([position[n] for n in names]), stretch(list(opened.names), names)
    if chosen.digest(kind) != digest:  # the bytes as stored, before any cast to the model's types (as recorded)
        raise RunStoreError(f"the input set {source} of run {run_dir} has other bytes now (its digest differs); give `inputs`")
    return chosen.checked(specs), where
