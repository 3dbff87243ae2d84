"""onnxruntime's verbose log of a session (``session.optimizer_log``) is read from descriptor 2, which is the
process's: start-up parts made in threads beside production's session (``runner._start``) each check a
``--disable-optimizer`` name against it (``known_optimizers``). Two captures of descriptor 2 at once took each
other's lines, and one restored the other's file as stderr: `make test` saw "no graph transformer of that name"
for Level2_RuleBasedTransformer and NhwcTransformer, the known list holding the rewrite rules alone."""

from __future__ import annotations

import threading

from onnx_builders import build_classifier_model
from qconsist.inference import ExecutionOptions
from qconsist.inference import session as session_module


def test_known_optimizers_asked_by_threads_at_once_is_the_log_of_one_session(tmp_path):
    models = [build_classifier_model(tmp_path / f"m{i}.onnx", batch="N", fc_bias=[0.1 * i, 0.0]) for i in range(4)]
    alone = session_module.known_optimizers(models[0])
    assert "Level2_RuleBasedTransformer" in alone and alone > session_module.REWRITE_RULES
    session_module._KNOWN_OPTIMIZERS.clear()
    found: dict[int, frozenset[str]] = {}
    start = threading.Barrier(8)

    def ask(index: int) -> None:
        start.wait()
        found[index] = session_module.known_optimizers(models[index % 4], ExecutionOptions())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [found[i] for i in range(8)] == [alone] * 8
