"""hvdtrain.data.datasets: the digits read without importing scikit-learn are scikit-learn's digits.

    python -m pytest -q tests/test_datasets.py
"""
import importlib.util

import numpy as np
from sklearn.datasets import load_digits

from hvdtrain.data import datasets


def test_digits_read_from_the_file_equal_load_digits():
    images, target = datasets.digits_arrays()
    bunch = load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == bunch.images.dtype
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(target, bunch.target)


def test_digits_fall_back_to_load_digits_when_the_file_is_elsewhere(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    images, target = datasets.digits_arrays()
    np.testing.assert_array_equal(images, load_digits().images)
    np.testing.assert_array_equal(target, load_digits().target)
