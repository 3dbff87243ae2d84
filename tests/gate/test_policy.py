"""The policy reader: defaults, explicit values, and one clear ConfigError for every bad file."""

from pathlib import Path

import pytest

from qconsist.errors import ConfigError
from qconsist.gate.policy import HashKind, Policy, load_policy, parse_policy

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def test_defaults_are_documented_and_equal_to_the_default_file():
    builtin = Policy().to_json()
    shipped = load_policy(POLICIES / "default.toml").to_json()
    builtin.pop("source"), shipped.pop("source")
    assert builtin == shipped
    assert builtin["drift"]["float"] == {"max_abs_diff": None, "min_top1_agreement": 0.9, "min_sqnr_db": 15.0}
    assert builtin["drift"]["baseline"] == {"max_abs_diff": 0.0, "min_top1_agreement": 1.0, "min_sqnr_db": None}
    assert builtin["artifacts"] == {"hash": "md5", "expect_changed": []}


def test_values_and_off():
    policy = parse_policy(
        '[artifacts]\nhash = "content"\nexpect_changed = ["quantize"]\n'
        '[drift.float]\nmax_abs_diff = 3\nmin_top1_agreement = "off"\n[calibration]\nwaive_nonfinite = ["x_scale"]\n'
    )
    assert policy.artifacts.hash is HashKind.CONTENT
    assert policy.artifacts.expect_changed == ("quantize",)
    assert policy.drift.float.max_abs_diff == 3.0 and policy.drift.float.min_top1_agreement is None
    assert policy.drift.baseline.max_abs_diff == 0.0  # untouched section keeps its default
    assert policy.calibration.waive_nonfinite == ("x_scale",)
    assert load_policy(POLICIES / "detector.toml").drift.float.max_abs_diff is None  # recorded, not judged


@pytest.mark.parametrize("text, message", [
    ("[artefacts]\n", r"policy: unknown key\(s\) artefacts; known: artifacts, calibration"),
    ("[artifacts]\nhashes = 'md5'\n", r"\[artifacts\]: unknown key\(s\) hashes; known: expect_changed, hash"),
    ("[artifacts]\nhash = 'crc32'\n", r"'hash' must be one of md5, sha256, content, computation, got 'crc32'"),
    ("[artifacts]\nexpect_changed = ['quantise']\n", r"expect_changed names unknown stage\(s\) quantise"),
    ("[drift.float]\nmax_abs_diff = -1\n", r"\[drift.float\]: max_abs_diff must be a finite number >= 0, got -1.0"),
    ("[drift.baseline]\nmin_top1_agreement = 1.5\n", r"min_top1_agreement must lie in \[0, 1\], got 1.5"),
    ("[drift.gpu]\n", r"\[drift\]: unknown key\(s\) gpu"),
    ("[gpu]\nrequire_pinned = 'yes'\n", r"'require_pinned' must be true or false, got 'yes'"),
    ("[inference]\nrepeat_must_be_identical = 1\n", r"must be true or false, got 1"),
    ("labels = 3\n", r"'labels' must be a table \(\[labels\]\), got int"),
    ("schema = 'qconsist.policy/9'\n", r"schema 'qconsist.policy/9' is not supported"),
    ("[artifacts\n", r"policy: invalid TOML"),
])
def test_bad_policy_is_one_config_error(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_policy(text)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match=r"policy file .*nope.toml does not exist"):
        load_policy(tmp_path / "nope.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text"):
        load_policy(binary)
