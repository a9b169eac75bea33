"""What a new user meets first: the docs/python.md model block runs as written, a small
tensor prints its values, token ids and targets may be integer arrays."""
import os
import re
import unittest

import numpy as np

import handgrad as hg

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")


def doc_block(heading):
    """The first ```python block after `heading` in docs/python.md."""
    with open(DOCS, encoding="utf-8") as f:
        text = f.read()
    match = re.search(re.escape(heading) + r".*?```python\n(.*?)```", text, re.S)
    assert match, f"no python block after {heading!r} in {DOCS}"
    return match.group(1)


class Docs(unittest.TestCase):
    def test_ops_and_model_block_runs_as_written(self):
        namespace = {}
        exec(compile(doc_block("## Ops, kernel mode, models"), "docs/python.md", "exec"), namespace)
        self.assertTrue(np.isfinite(namespace["loss"].item()))


class Repr(unittest.TestCase):
    def test_small_tensors_show_their_values(self):
        self.assertEqual(repr(hg.full((), 2.5)), "Tensor(2.5, dtype=float32)")
        self.assertEqual(repr(hg.tensor(np.array([[1.0, 2.0], [3.0, 4.5]]))),
                         "Tensor([[1, 2], [3, 4.5]], dtype=float32)")
        self.assertIn("Tensor(", str(hg.zeros(3)))

    def test_large_tensors_show_their_shape_only(self):
        text = repr(hg.zeros((100, 100)))
        self.assertIn("(100, 100)", text)
        self.assertNotIn("0, 0", text)


class IntegerIds(unittest.TestCase):
    def setUp(self):
        self.model = hg.DecoderLM(vocab_size=16, max_seq_len=8, d_model=32, n_heads=2, n_layers=1, seed=0)
        self.ids = np.array([[1, 2, 3, 15], [0, 5, 6, 7]])

    def test_integer_ids_equal_float32_ids(self):
        want = self.model.forward(hg.tensor(self.ids.astype(np.float32))).numpy().copy()
        for ids in (self.ids, self.ids.astype(np.int32), self.ids.astype(np.uint8), self.ids.tolist()):
            np.testing.assert_array_equal(self.model.forward(ids).numpy(), want)

    def test_integer_targets_equal_float32_targets(self):
        logits = self.model.forward(self.ids)
        targets = np.array([[2, 3, -100, 0], [5, 6, 7, 8]])
        want, _ = hg.cross_entropy_forward(logits, hg.tensor(targets.astype(np.float32)), -100)
        got, _ = hg.cross_entropy_forward(logits, targets, -100)
        self.assertEqual(got.item(), want.item())

    def test_bad_ids_are_refused_by_name(self):
        with self.assertRaisesRegex(hg.Error, "DecoderLM.forward: ids must be integers .* bool"):
            self.model.forward(np.ones((1, 2), dtype=bool))
        with self.assertRaisesRegex(hg.Error, "not exact in float32"):
            self.model.forward(np.array([[1 << 25]]))
        with self.assertRaisesRegex(hg.Error, "id 16 .*not an integer in \\[0, 16\\)"):
            self.model.forward(np.array([[16]]))


if __name__ == "__main__":
    unittest.main()
