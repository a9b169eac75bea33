"""DecoderLM.generate from Python: the C++ generate() with a key/value cache (docs/generation.md)."""
import unittest

import numpy as np

import handgrad as hg


def make(context=12):
    model = hg.DecoderLM(vocab_size=20, max_seq_len=context, d_model=32, n_heads=2, n_layers=2, seed=3)
    model.eval()
    return model


def greedy_by_forward(model, ids, steps, context):
    """nanoGPT's loop on forward over the whole (cropped) context: the last position's argmax."""
    ids = np.array(ids, dtype=np.int64)
    for _ in range(steps):
        logits = model.forward(ids[:, -context:]).numpy()
        ids = np.concatenate([ids, logits[:, -1, :].argmax(axis=1)[:, None]], axis=1)
    return ids


class Generate(unittest.TestCase):
    def test_greedy_equals_recomputing_the_prefix(self):
        """Temperature 0 with the cache gives the tokens of argmax over forward on the whole prefix, past the context."""
        model = make(context=12)
        for p in model.parameters():  # larger weights: logits far apart, no near-ties between the two paths
            p.value.numpy()[...] *= 3.0
        prompt = np.array([[1, 5, 7], [2, 2, 9]])
        got = model.generate(prompt, 20, temperature=0.0)
        self.assertEqual(got.dtype, np.int64)
        self.assertEqual(got.shape, (2, 23))
        np.testing.assert_array_equal(got[:, :3], prompt)
        np.testing.assert_array_equal(got, greedy_by_forward(model, prompt, 20, 12))
        np.testing.assert_array_equal(model.generate(prompt, 20, temperature=0.0, kv_cache=False), got)
        self.assertGreater(len(set(got[0, 3:].tolist())), 2)  # not one token repeated

    def test_one_prompt_and_seeds(self):
        model = make()
        a = model.generate([4, 1, 3], 15, temperature=1.0, top_k=10, top_p=0.9, seed=7)
        self.assertEqual(a.shape, (18,))
        np.testing.assert_array_equal(a, model.generate(np.array([4, 1, 3]), 15, temperature=1.0, top_k=10,
                                                        top_p=0.9, seed=7))
        self.assertFalse(np.array_equal(a, model.generate([4, 1, 3], 15, temperature=1.0, top_k=10, top_p=0.9,
                                                          seed=8)))
        np.testing.assert_array_equal(model.generate([4, 1, 3], 15, top_k=1, seed=5),
                                      model.generate([4, 1, 3], 15, temperature=0.0))

    def test_bad_values_are_refused(self):
        model = make()
        with self.assertRaisesRegex(hg.Error, r"temperature -1 must be finite and >= 0"):
            model.generate([1], 3, temperature=-1.0)
        with self.assertRaisesRegex(hg.Error, r"top_p 0 must lie in \(0, 1\]"):
            model.generate([1], 3, top_p=0.0)
        with self.assertRaisesRegex(hg.Error, r"top_k -2 must be >= 0"):
            model.generate([1], 3, top_k=-2)
        with self.assertRaisesRegex(hg.Error, r"prompt 0 holds id 20"):
            model.generate([1, 20], 3)


if __name__ == "__main__":
    unittest.main()
