"""GPU experiments: which nodes make results vary on the CUDA EP, and which configuration to pin.

* ``config``: the configuration matrix (cuDNN algorithm search x TF32, workspace, deterministic compute)
  and ``NVIDIA_TF32_OVERRIDE``;
* ``device``: is a CUDA GPU really usable (``UnavailableError`` otherwise);
* ``observe``: every tensor of the graph that runs, with fresh sessions on demand;
* ``comparison`` / ``repeats``: on-the-fly comparisons, origin nodes, repeat and algorithm sensitivity;
* ``latency`` / ``decision``: per-config latency and the recommendation;
* ``contention``: a second process loading the GPU;
* ``calibration``: repeated calibration on the CUDA EP vs the CPU;
* ``fp16``: float16 conversion and the first NaN/Inf/overflow node;
* ``nondeterminism``: the operators known to vary on the CUDA EP (condition, mechanism, fix, source) and
  the nodes of a model that match;
* ``locate`` / ``report`` / ``run``: the engine, the ``LocateReport`` and the ``qconsist locate`` run.
"""
