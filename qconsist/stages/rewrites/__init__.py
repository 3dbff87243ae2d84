"""Equivalent ONNX forms of operators whose CUDA kernels are not deterministic (used by ``determinize.py``)."""
