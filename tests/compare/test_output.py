"""One top-1 for any batch, the output effect and the origin rule, checked on batches of 4."""

from __future__ import annotations

import numpy as np

from qconsist.compare import OutputEffect, compare_outputs, origins, top1


def test_top1_is_per_sample_for_any_batch():
    batch = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], np.float32)
    assert top1(batch).tolist() == [1, 0, 1, 0]  # never a flat arg-max over the batch
    assert top1(np.array([0.2, 0.5, 0.3])).tolist() == [1]  # one sample without a batch axis
    assert top1(np.zeros((2, 3, 4)) + np.arange(12).reshape(3, 4)).tolist() == [11, 11]
    assert top1(np.array([[np.nan, 0.1, 0.2]])).tolist() == [2]  # NaN is never the class


def test_output_effect_counts_samples_not_steps():
    a = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], np.float32)
    b = a.copy()
    b[1] = [0.1, 0.9]  # sample 1 flips class
    b[3, 0] = np.nextafter(b[3, 0], np.float32(1))  # sample 3 moves one ULP, same class
    effect = OutputEffect()
    effect.add(0, [a], [a.copy()])
    effect.add(4, [a], [b])
    assert effect.samples == 8 and effect.top1_agree == 7 and effect.top1_agreement == 7 / 8
    assert effect.differing_samples == [5, 7] and not effect.identical
    assert effect.greatest_abs == float(np.abs(a.astype(np.float64) - b).max())


def test_compare_outputs_in_batches_agrees_with_one_sample_at_a_time():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(4, 5)).astype(np.float32)
    b = a + rng.normal(0, 0.3, a.shape).astype(np.float32)
    batched = compare_outputs([{"y": a}], [{"y": b}], atol=0.1, rtol=0.0)
    single = compare_outputs([{"y": a[i:i + 1]} for i in range(4)], [{"y": b[i:i + 1]} for i in range(4)], atol=0.1, rtol=0.0)
    expected_agree = float(np.mean(a.argmax(1) == b.argmax(1)))
    for result in (batched, single):
        assert result.samples == 4
        assert result.top1_agreement == expected_agree
        assert result.mismatched == int(np.count_nonzero(np.abs(a - b) > 0.1))
        assert result.max_abs_diff == float(np.abs(a.astype(np.float64) - b).max())


def test_origin_rule_on_a_table():
    # tensors x -> c -> r ; node conv (x -> c), relu (c -> r)
    nodes = [([0], [1]), ([1], [2])]
    differ = np.array([[False, True, True], [False, False, True], [True, True, True]])
    found = origins(differ, nodes)
    assert found.tolist() == [[True, False], [False, True], [False, False]]
