"""The ops from Python: forward against NumPy float64 references, the hand-written
backward against float64 finite differences, fused against unfused, and bad input."""
import os
import subprocess
import sys
import unittest

import numpy as np

import handgrad as hg


def numerical_grad(f, x, eps=1e-6):
    """d sum(f(x) * weights) / dx by central differences (f returns a scalar)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        up = f(x)
        x[i] = old - eps
        down = f(x)
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


def ln_ref(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def softmax_ref(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def t64(a):
    return hg.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


class LayerNorm(unittest.TestCase):
    def test_forward_matches_reference_fused_and_unfused(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(3, 5, 37)) * 3 + 1000.0  # large offset
        g, b = rng.normal(size=37), rng.normal(size=37)
        for mode in ("fused", "unfused"):
            with hg.kernels(mode):
                self.assertEqual(hg.kernel_mode(), mode)
                y, saved = hg.layernorm_forward(t64(x), t64(g), t64(b), 1e-5)
                np.testing.assert_allclose(y.numpy(), ln_ref(x, g, b, 1e-5), rtol=1e-9, atol=1e-9)
                np.testing.assert_allclose(saved.mean.numpy(), x.reshape(-1, 37).mean(-1), rtol=1e-12)
        self.assertEqual(hg.kernel_mode(), "fused")

    def test_backward_matches_finite_differences(self):
        rng = np.random.default_rng(1)
        x, g, b = rng.normal(size=(4, 7)), rng.normal(size=7), rng.normal(size=7)
        w = rng.normal(size=(4, 7))
        for mode in ("fused", "unfused"):
            with hg.kernels(mode):
                _, saved = hg.layernorm_forward(t64(x), t64(g), t64(b), 1e-5)
                dx, dg, db = hg.layernorm_backward(t64(w), t64(x), t64(g), saved)
                np.testing.assert_allclose(dx.numpy(), numerical_grad(lambda v: (ln_ref(v, g, b, 1e-5) * w).sum(), x),
                                           rtol=1e-6, atol=1e-8)
                np.testing.assert_allclose(dg.numpy(), numerical_grad(lambda v: (ln_ref(x, v, b, 1e-5) * w).sum(), g),
                                           rtol=1e-6, atol=1e-8)
                np.testing.assert_allclose(db.numpy(), w.sum(0), rtol=1e-12)

    def test_float32_constant_rows_stay_finite(self):
        x = np.full((2, 64), 3.0, np.float32)
        y, _ = hg.layernorm_forward(hg.from_numpy(x), hg.ones(64), hg.zeros(64), 1e-5)
        self.assertTrue(np.isfinite(y.numpy()).all())
        np.testing.assert_allclose(y.numpy(), 0.0, atol=1e-6)

    def test_bad_input_raises(self):
        x = hg.zeros((4, 6))
        with self.assertRaisesRegex(hg.Error, r"layernorm_forward: gamma shape \(5\)"):
            hg.layernorm_forward(x, hg.ones(5), hg.zeros(6), 1e-5)
        with self.assertRaisesRegex(hg.Error, "layernorm_forward"):
            hg.layernorm_forward(x, hg.ones(6, "float64"), hg.zeros(6), 1e-5)
        with self.assertRaisesRegex(hg.Error, "eps"):
            hg.layernorm_forward(x, hg.ones(6), hg.zeros(6), -1.0)
        with self.assertRaisesRegex(hg.Error, "BF16 on the CPU"):
            hg.layernorm_forward(x.to("bfloat16"), hg.ones(6), hg.zeros(6), 1e-5)
        _, saved = hg.layernorm_forward(x, hg.ones(6), hg.zeros(6), 1e-5)
        with self.assertRaisesRegex(hg.Error, "layernorm_backward"):
            hg.layernorm_backward(hg.zeros((4, 5)), x, hg.ones(6), saved)
        with self.assertRaises(hg.Error):
            hg.set_kernel_mode("fastest")
        with self.assertRaises(TypeError):
            hg.layernorm_forward(np.zeros((4, 6)), hg.ones(6), hg.zeros(6))


class Softmax(unittest.TestCase):
    def attention_ref(self, s, mask, causal, scale):
        z = scale * s + (0 if mask is None else mask)
        if causal:
            Tq, Tk = s.shape[-2:]
            z = np.where(np.arange(Tk)[None, :] > np.arange(Tq)[:, None] + (Tk - Tq), -np.inf, z)
        return softmax_ref(z)

    def test_attention_forward_and_backward(self):
        rng = np.random.default_rng(2)
        B, H, Tq, Tk = 2, 3, 4, 6
        s = rng.normal(size=(B, H, Tq, Tk)) * 4
        mask = np.zeros((B, 1, 1, Tk))
        mask[1, ..., -2:] = -np.inf  # padding keys of batch 1
        w = rng.normal(size=s.shape)
        for mode in ("fused", "unfused"):
            with hg.kernels(mode):
                for m, causal in [(None, False), (mask, False), (None, True), (mask, True)]:
                    y = hg.attention_softmax_forward(t64(s), None if m is None else t64(m), causal, 0.5)
                    ref = self.attention_ref(s, m, causal, 0.5)
                    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-10, atol=1e-14)
                    dx = hg.softmax_backward(t64(w), y, 0.5)
                    fd = numerical_grad(lambda v: (self.attention_ref(v, m, causal, 0.5) * w).sum(), s.copy())
                    np.testing.assert_allclose(dx.numpy(), fd, rtol=1e-5, atol=1e-8)

    def test_fully_masked_rows_give_zeros(self):
        mask = np.full((1, 1, 1, 5), -np.inf)
        y = hg.attention_softmax_forward(t64(np.ones((1, 2, 3, 5))), t64(mask), False, 1.0)
        self.assertTrue((y.numpy() == 0).all())

    def test_plain_softmax(self):
        x = np.random.default_rng(3).normal(size=(5, 9)).astype(np.float32)
        np.testing.assert_allclose(hg.softmax_forward(hg.from_numpy(x)).numpy(), softmax_ref(x.astype(np.float64)),
                                   rtol=1e-5, atol=1e-7)

    def test_bad_input_raises(self):
        s = hg.zeros((2, 2, 3, 4))
        with self.assertRaisesRegex(hg.Error, "mask"):
            hg.attention_softmax_forward(s, hg.zeros((2, 1, 1, 5)))
        with self.assertRaisesRegex(hg.Error, "mask"):
            hg.attention_softmax_forward(s, hg.zeros((2, 1, 1, 4), "float64"))
        with self.assertRaisesRegex(hg.Error, "scale"):
            hg.attention_softmax_forward(s, None, False, float("inf"))
        with self.assertRaises(hg.Error):
            hg.attention_softmax_forward(hg.zeros((3, 4)), None, True, 1.0)
        with self.assertRaisesRegex(hg.Error, "softmax_backward"):
            hg.softmax_backward(hg.zeros((2, 2, 3, 5)), s)


class CrossEntropy(unittest.TestCase):
    def test_forward_backward_with_ignore_index(self):
        rng = np.random.default_rng(4)
        logits = rng.normal(size=(6, 11)) * 3
        targets = np.array([0, 3, -100, 10, 5, -100], np.float32)

        def loss_ref(z):
            lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
            keep = targets != -100
            idx = targets[keep].astype(int)
            return (lse[keep] - z[keep][np.arange(len(idx)), idx]).mean()

        for mode in ("fused", "unfused"):
            with hg.kernels(mode):
                loss, saved = hg.cross_entropy_forward(t64(logits), hg.from_numpy(targets.copy()), -100)
                self.assertEqual(loss.shape, ())
                self.assertEqual(saved.n_valid, 4)
                self.assertAlmostEqual(loss.item(), loss_ref(logits), places=12)
                d = hg.cross_entropy_backward(saved, 2.0)
                np.testing.assert_allclose(d.numpy(), 2.0 * numerical_grad(loss_ref, logits.copy()),
                                           rtol=1e-6, atol=1e-8)

    def test_all_ignored_is_zero_not_nan(self):
        loss, saved = hg.cross_entropy_forward(hg.ones((3, 4)), hg.full((3,), -100.0), -100)
        self.assertEqual(loss.item(), 0.0)
        self.assertTrue((hg.cross_entropy_backward(saved).numpy() == 0).all())

    def test_bad_targets_raise(self):
        with self.assertRaisesRegex(hg.Error, "target 7"):
            hg.cross_entropy_forward(hg.zeros((2, 4)), hg.tensor([1, 7]), -100)
        with self.assertRaisesRegex(hg.Error, "cross_entropy"):
            hg.cross_entropy_forward(hg.zeros((2, 4)), hg.tensor([1, 2], "float64"), -100)
        with self.assertRaises(hg.Error):
            hg.cross_entropy_forward(hg.zeros((2, 4)), hg.tensor([1, 2, 3]), -100)

    def test_on_device_changes_nothing_on_the_cpu(self):
        """on_device=True skips the host read only on CUDA (tests/test_torch.py's GPU case)."""
        loss, saved = hg.cross_entropy_forward(hg.ones((3, 4)), hg.tensor([0, -100, 3]), -100, on_device=True)
        self.assertEqual(saved.n_valid, 2)
        self.assertAlmostEqual(loss.item(), np.log(4), places=6)
        with self.assertRaisesRegex(hg.Error, "target 7"):
            hg.cross_entropy_forward(hg.zeros((2, 4)), hg.tensor([1, 7]), -100, on_device=True)


class Streams(unittest.TestCase):
    def test_set_cuda_stream_checks_its_argument(self):
        hg.set_cuda_stream(None)  # handgrad's own stream: already in use, nothing to do
        with self.assertRaisesRegex(hg.Error, "expected a cudaStream_t as an int"):
            hg.set_cuda_stream("default")


# A fresh interpreter that loads other C++ code first: NumPy (2.x loads libstdc++.so.6) and, for
# a NumPy that does not, libstdc++.so.6 itself. Then errors whose messages format doubles.
_OTHERS_FIRST = """
import ctypes, numpy
ctypes.CDLL("libstdc++.so.6")
import handgrad as hg
for call in (lambda: hg.cross_entropy_forward(hg.zeros((2, 4)), hg.tensor([1, 7.5]), -100),
             lambda: hg.layernorm_forward(hg.zeros((2, 4)), hg.ones(4), hg.zeros(4), -0.25)):
    try:
        call()
    except hg.Error as e:
        print("caught:", e)
"""


class ErrorsWithOtherCxxLoadedFirst(unittest.TestCase):
    def test_errors_with_doubles_after_numpy(self):
        """On the GPU machine a static libstdc++ inside _C.so made this segfault (docs/python.md)."""
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(hg.__file__))))
        r = subprocess.run([sys.executable, "-c", _OTHERS_FIRST], env=env, capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, f"the interpreter died (rc {r.returncode}): {r.stderr[-2000:]}")
        self.assertIn("target 7.5 at flat position 1", r.stdout)
        self.assertIn("-0.25", r.stdout)


if __name__ == "__main__":
    unittest.main()
