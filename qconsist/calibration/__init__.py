"""Repeated calibration: do N calibrations of the same model on the same inputs give the same quantized model?

``qconsist.calibration.repeat.repeat_calibration``; the calibration table it compares is the quantize stage's
(``qconsist.stages.calibration_table``).
"""
