"""Targets are typed and validated: every spelling the command takes, and one clear line for each bad one."""

from __future__ import annotations

import math

import pytest

from qconsist.compare.kinds import JudgedOutput, OutputKind
from qconsist.errors import ConfigError
from qconsist.sensitivity.figures import Figures, OutputFigures, standing
from qconsist.sensitivity.target import Measure, Target, parse_targets


@pytest.mark.parametrize("text, measure, bound, output", [
    ("sqnr>=40", Measure.SQNR, 40.0, None),
    (" SQNR >= 40.5 ", Measure.SQNR, 40.5, None),
    ("sqnr[prob]>=45", Measure.SQNR, 45.0, "prob"),
    ("sqnr[output0[:, 4:22]]>=20", Measure.SQNR, 20.0, "output0[:, 4:22]"),
    ("cosine>=0.999", Measure.COSINE, 0.999, None),
    ("max-abs[boxes]<=0.5", Measure.MAX_ABS, 0.5, "boxes"),
    ("top1>=0.999", Measure.TOP1, 0.999, None),
    ("top1>=99.9%", Measure.TOP1, 0.999, None),
    ("accuracy-drop<=0.1", Measure.ACCURACY_DROP, 0.1, None),
])
def test_targets_parse(text, measure, bound, output):
    target = Target.parse(text)
    assert (target.measure, target.output) == (measure, output)
    assert target.bound == pytest.approx(bound, rel=0, abs=1e-12)
    assert Target.parse(target.text) == target
    assert Target.from_json(target.to_json()) == target


@pytest.mark.parametrize("text, message", [
    ("sqnr", "target 'sqnr' is not MEASURE>=BOUND or MEASURE<=BOUND (e.g. \"sqnr>=40\", \"top1>=0.999\", "
             "\"accuracy-drop<=0.1\", \"sqnr[prob]>=45\"; measures: sqnr, cosine, max-abs, top1, accuracy-drop)"),
    ("snr>=40", "target 'snr>=40': unknown measure 'snr' (measures: sqnr, cosine, max-abs, top1, accuracy-drop)"),
    ("sqnr<=40", "target 'sqnr<=40': sqnr takes a lower bound: write sqnr>=40"),
    ("sqnr>40", "target 'sqnr>40': sqnr takes a lower bound: write sqnr>=40"),
    ("accuracy-drop>=0.1", "target 'accuracy-drop>=0.1': accuracy-drop takes an upper bound: write accuracy-drop<=0.1"),
    ("sqnr>=forty", "target 'sqnr>=forty': the bound 'forty' is not a number"),
    ("sqnr>=inf", "target 'sqnr>=inf': the bound must be a finite number"),
    ("top1>=1.5", "target top1>=1.5: top-1 agreement is a fraction in [0, 1] (write top1>=0.999 for 99.9%)"),
    ("cosine>=2", "target cosine>=2: a cosine similarity lies in [-1, 1]"),
    ("max-abs<=-1", "target max-abs<=-1: max-abs is never negative; give a bound >= 0"),
    ("top1[prob]>=0.9", "target top1[prob]>=0.9: top1 applies to the class-scores output; name no output"),
])
def test_bad_targets_are_one_clear_line(text, message):
    with pytest.raises(ConfigError) as raised:
        Target.parse(text)
    assert raised.value.message == message


def test_the_same_target_twice_is_refused():
    with pytest.raises(ConfigError, match=r"^target sqnr>=40 is given twice$"):
        parse_targets(["sqnr>=40", "sqnr >= 40"])


JUDGED = [JudgedOutput("prob", OutputKind.CLASS_SCORES, "inferred"), JudgedOutput("boxes", OutputKind.REGRESSION, "declared")]


def test_a_target_must_apply_to_the_model():
    Target.parse("sqnr[boxes]>=20").check(JUDGED, labelled=False)
    Target.parse("top1>=0.9").check(JUDGED, labelled=False)
    with pytest.raises(ConfigError, match=r"^target sqnr\[map\]>=20: the model has no output or part 'map' \(its outputs "
                                          r"and parts: prob, boxes\)$"):
        Target.parse("sqnr[map]>=20").check(JUDGED, labelled=False)
    with pytest.raises(ConfigError, match=r"^target accuracy-drop<=0.1 needs labelled inputs: give --labels FILE"):
        Target.parse("accuracy-drop<=0.1").check(JUDGED, labelled=False)
    maps = [JudgedOutput("map", OutputKind.MAP, "declared")]
    with pytest.raises(ConfigError, match=r"^target top1>=0.9 needs a class-scores output, and the model has none "
                                          r"declared or inferred \(map: map\); declare one"):
        Target.parse("top1>=0.9").check(maps, labelled=True)


def _figures(sqnr: float, top1: float | None = None, accuracy: float | None = None) -> Figures:
    return Figures(samples=4, outputs=[OutputFigures("prob", "class-scores", sqnr, 0.99, 0.01, top1),
                                       OutputFigures("boxes", "regression", sqnr + 10, 0.999, 2.0)],
                   top1_agreement=top1, accuracy=accuracy, float_accuracy=0.75 if accuracy is not None else None)


def test_what_a_target_reads_and_how_models_are_ordered():
    figures = _figures(30.0, 0.75, 0.5)
    assert figures.value(Target.parse("sqnr>=40")) == 30.0  # the worst output
    assert figures.value(Target.parse("sqnr[boxes]>=40")) == 40.0
    assert figures.value(Target.parse("max-abs<=1")) == 2.0  # the worst: the greatest
    assert figures.value(Target.parse("top1>=0.9")) == 0.75
    assert figures.value(Target.parse("accuracy-drop<=1")) == pytest.approx(25.0)  # 75% -> 50%: 25 points
    assert figures.meets(Target.parse("sqnr[boxes]>=40")) and not figures.meets(Target.parse("sqnr>=40"))
    assert math.isnan(_figures(30.0).value(Target.parse("top1>=0.9")))
    assert not _figures(30.0).meets(Target.parse("top1>=0.9"))  # nothing to read never meets a target
    targets = [Target.parse("sqnr>=40")]
    base = _figures(30.0)
    assert standing(_figures(35.0), targets, base) == (0.0, 0.5, 35.0)  # half the gap closed
    assert standing(_figures(41.0), targets, base) == (1.0, 1.0, 41.0)
    assert standing(_figures(35.0), targets, base) > standing(_figures(31.0), targets, base)
    assert Figures.from_json(figures.to_json()) == figures
