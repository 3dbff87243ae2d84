"""Caffe models: reading them (with caffe2onnx's own proto schema) and converting them to ONNX."""
