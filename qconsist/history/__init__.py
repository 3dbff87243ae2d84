"""The nightly history: an embedded SQLite database, and the changes it tells of."""

from qconsist.history.db import History
from qconsist.history.timeline import Change, model_timeline

__all__ = ["Change", "History", "model_timeline"]
