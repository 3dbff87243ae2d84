"""Two runs of the same pipeline give byte-identical artifacts: what a nightly md5 comparison relies on."""

from pathlib import Path

from qconsist.pipeline.config import load_pipeline
from qconsist.pipeline.runner import run_pipeline

OPEN_NSFW = Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw.toml"


def test_second_run_in_another_folder_has_the_same_md5s(nsfw_run, tmp_path):
    config = load_pipeline(OPEN_NSFW)
    other = run_pipeline(config, runs_dir=tmp_path / "elsewhere", run_id="second")
    for stage in ("convert", "optimize", "quantize"):
        first, second = nsfw_run.artifacts[stage], other.artifacts[stage]
        assert first.md5 == second.md5, f"{stage} md5 differs between two runs"
        assert first.content == second.content
        assert first.initializers == second.initializers
