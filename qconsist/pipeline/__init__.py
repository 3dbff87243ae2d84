"""The pipeline: a TOML file (``config``) run stage by stage into a run directory (``runner``).

Import from the submodules: ``qconsist.pipeline.config.load_pipeline``, ``qconsist.pipeline.runner.run_pipeline``;
``qconsist.pipeline.inputs.open_inputs`` opens a model's inputs by the CLI's rules (``InputOptions``).
"""
