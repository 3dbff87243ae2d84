"""Bundled model descriptions (``models/*.toml``) and the fetcher that brings their files into the cache."""

from qconsist.models.registry import ModelDescription, fetch_model, find_model

__all__ = ["ModelDescription", "fetch_model", "find_model"]
