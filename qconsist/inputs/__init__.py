"""Input sets: photographs with declared preprocessing, labelled image folders, or .npy/.npz arrays, prepared
by parallel input workers and delivered in order."""

from qconsist.inputs.inputset import InputSet, open_input_set
from qconsist.inputs.labels import Labels
from qconsist.inputs.options import InputOptions
from qconsist.inputs.preprocess import Preprocess

__all__ = ["InputOptions", "InputSet", "Labels", "Preprocess", "open_input_set"]
