"""Weeks of nightly history for the history page's tests, from real nights.

Three real nights of the small conv net (``nightly_files.convnet_nightly``: ``convnet`` and ``convnet-percentile``)
give real outcomes: a first night (no baseline), a night whose calibration input changed (the quantized md5 changes,
the gate fails naming the first diverging node and the origin nodes) and a night with the input restored (passes
against the first). ``weeks_of_nights`` replays those outcomes night after night, on explicit dates, through the
history's own API (``History``: ``start_night``, ``record_hashes``, ``finish_entry``... as the nightly's head
process records a night), for ``convnet`` on the CPU and for ``convnet-percentile`` fanned out over two GPU types.
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nightly_files import convnet_nightly
from qconsist.environment import fingerprint
from qconsist.history import History
from qconsist.nightly import load_nightly, run_nightly
from qconsist.nightly.entry import EntryOutcome

DAYS = 28
CHANGED_DAY = 18  # the calibration input changes: md5 changes, the gate fails naming the origin node
FIXED_DAY = 21  # the input is restored
LOST_DAY = 12  # convnet-percentile@H200: its worker was lost
ENVIRONMENT_DAY = 24  # OMP_NUM_THREADS is 7 from this night on (CHANGED_ENVIRONMENT)
CHANGED_ENVIRONMENT = ("OMP_NUM_THREADS", "7")
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


@dataclass
class RealNights:
    folder: Path
    config: Path
    first: dict[str, EntryOutcome]  # model -> outcome
    changed: dict[str, EntryOutcome]
    restored: dict[str, EntryOutcome]


def run_real_nights(folder: Path) -> RealNights:
    """The three real nights (runs under ``folder/runs``, their own history ``folder/runs/history.sqlite``)."""
    config = convnet_nightly(folder, percentile=True)
    calibration = np.load(folder / "calibration.npy")
    outcomes = []
    for scale in (1.0, 4.0, 1.0):
        changed = calibration.copy()
        changed[2] *= scale  # one calibration input changes, then is restored
        np.save(folder / "calibration.npy", changed)
        result = run_nightly(load_nightly(config))
        outcomes.append({e.model: e for e in result.entries})
    return RealNights(folder, config, *outcomes)


def night_id(day: dt.datetime, index: int) -> str:
    return f"nightly-{day:%Y%m%dT%H%M%S}-{index:06x}"


def _record(history: History, night: str, key: str, outcome: EntryOutcome, when: str, baseline: str | None,
            gpu_type: str | None = None, gpus: tuple[str, ...] = ()) -> None:
    history.start_entry(night, key, started=when)
    for run in outcome.runs:
        history.record_run(night, key, run.role, run.run_id, run.kind, run.path)
    if outcome.hashes:
        history.record_hashes(night, key, outcome.hashes)
    history.finish_entry(night, key, outcome.entry_run, outcome.verdict, baseline if outcome.verdict else None, outcome.error,
                         gpu_type=gpu_type, gpus=gpus or outcome.gpus, finished=when)


def weeks_of_nights(history: History, real: RealNights, start: dt.datetime, days: int = DAYS) -> list[str]:
    """``days`` nights from ``start`` (UTC, one a day), replaying the real outcomes; the night ids."""
    environment = fingerprint()
    later = copy.deepcopy(environment)
    later.setdefault("env", {})[CHANGED_ENVIRONMENT[0]] = CHANGED_ENVIRONMENT[1]
    last_good: dict[str, str] = {}
    nights = []
    for day in range(days):
        when = start + dt.timedelta(days=day)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        night = night_id(when, day)
        history.start_night(night, str(real.config), later if day >= ENVIRONMENT_DAY else environment, started=stamp)
        source = real.first if day == 0 else real.changed if CHANGED_DAY <= day < FIXED_DAY else real.restored
        entries = [("convnet", source["convnet"], None, ()),
                   ("convnet-percentile@H100", source["convnet-percentile"], "H100", (H100,)),
                   ("convnet-percentile@H200", source["convnet-percentile"], "H200", (H200,))]
        for key, outcome, gpu_type, gpus in entries:
            if key.endswith("@H200") and day == LOST_DAY:
                outcome = EntryOutcome(model=key, status="error", gpu_type=gpu_type,
                                       error="its worker was lost 3 time(s); last: attempt 3 lost during inference:quantized: "
                                             "WorkerCrashedError")
            _record(history, night, key, outcome, stamp, last_good.get(key), gpu_type, gpus)
            if key == "convnet" and outcome.verdict is not None:  # the run accuracy, recorded as its helper will
                history.record_figures(night, key, {"accuracy.top1": outcome.verdict.check("labels.accuracy").measured["accuracy"],
                                                    "accuracy.top5": 1.0})
            if outcome.status == "pass":
                last_good[key] = night
        history.finish_night(night, {}, finished=stamp)
        nights.append(night)
    return nights
