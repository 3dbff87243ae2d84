"""``qconsist diff``: where two runs part — artifacts, calibration tables, tensors, final outputs."""
