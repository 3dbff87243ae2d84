"""``InputOptions``: which samples a command reads, as typed options (the CLI's inputs group builds one).

The input set (``package:photos``, a folder of images, a .npy/.npz file...), the pipeline file whose
``[preprocess]`` prepares its images (else the source run's own), the labels, the slice (``offset``,
``count``) and the input workers. Validated on creation; ``to_args`` gives the flags back, for a command that
runs ``qconsist run`` in another environment. ``qconsist.pipeline.inputs.open_inputs`` opens them for a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qconsist.errors import ConfigError

PHOTOS = "package:photos"


@dataclass(frozen=True)
class InputOptions:
    source: str | None = PHOTOS  # None: the inputs the run recorded (commands that read a run say so)
    pipeline: Path | None = None
    offset: int = 0
    count: int | None = None  # None: every sample from ``offset``
    workers: int | None = None  # None: as many as the cores and the set's size suit
    labels: Path | None = None

    def __post_init__(self) -> None:
        if self.source is not None and (not isinstance(self.source, str) or not self.source.strip()):
            raise ConfigError(f"`inputs` must name an input set, got {self.source!r}")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or self.offset < 0:
            raise ConfigError(f"`offset` must be >= 0, got {self.offset}")
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1):
            raise ConfigError(f"`count` must be >= 1, got {self.count}")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0):
            raise ConfigError(f"`workers` must be >= 0, got {self.workers}")

    def to_args(self) -> list[str]:
        """The command-line flags that select these samples (paths absolute, so they hold in another directory)."""
        args = (["--inputs", self.source] if self.source is not None else []) + ["--offset", str(self.offset)]
        if self.count is not None:
            args += ["--count", str(self.count)]
        if self.pipeline is not None:
            args += ["--pipeline", str(Path(self.pipeline).resolve())]
        if self.workers is not None:
            args += ["--workers", str(self.workers)]
        if self.labels is not None:
            args += ["--labels", str(Path(self.labels).resolve())]
        return args
