"""Calibration tables (``table``) and repeated calibration (``repeat``): do N calibrations agree?

Import from the submodules: ``qconsist.calibration.table.build_table``,
``qconsist.calibration.repeat.repeat_calibration``.
"""
