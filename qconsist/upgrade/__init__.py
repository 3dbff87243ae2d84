"""Whether an onnxruntime upgrade changes a model's results (``qconsist upgrade-check``): the model run here and
in a second environment with only onnxruntime's pin changed, the two runs diffed, the rewrites named."""
