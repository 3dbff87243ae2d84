"""The pipeline's stages: convert (Caffe → ONNX), optimize, quantize."""
