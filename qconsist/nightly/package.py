"""``package:`` paths, defined in ``qconsist.inputs.package`` (every command takes them); kept importable here."""

from qconsist.inputs.package import PREFIX, is_package_path, resolve_package_path

__all__ = ["PREFIX", "is_package_path", "resolve_package_path"]
