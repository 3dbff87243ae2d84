"""Input sets: photographs with declared preprocessing, or .npy/.npz arrays, fed one sample at a time."""

from qconsist.inputs.inputset import InputSet, open_input_set
from qconsist.inputs.preprocess import Preprocess

__all__ = ["InputSet", "Preprocess", "open_input_set"]
