"""The nightly history: an embedded SQLite database, the changes it tells of, and its summary at a glance."""

from qconsist.history.db import History
from qconsist.history.summary import HistorySummary, summarize_history
from qconsist.history.timeline import Change, model_timeline

__all__ = ["Change", "History", "HistorySummary", "model_timeline", "summarize_history"]
