"""handgrad.torch against PyTorch autograd: torch.autograd.gradcheck in float64,
float32 against torch's own ops, drop-in modules, DLPack with torch. The C++
autograd Functions (handgrad._torch_ext) against the Python ones. Skips
visibly without PyTorch; the CUDA cases skip without a GPU."""
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import handgrad as hg

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import handgrad.torch as hgt
except ImportError:  # PyTorch is optional
    torch = None

needs_torch = unittest.skipIf(torch is None, "SKIPPED: PyTorch not installed (apt-get install python3-torch)")
needs_ext = unittest.skipUnless(
    torch is not None and hgt._ext is not None,
    "SKIPPED: HG_TORCH_EXT=0 (the Python autograd Functions are under test)" if os.environ.get("HG_TORCH_EXT") == "0"
    else "SKIPPED: handgrad._torch_ext not built (PyTorch's C++ headers missing; docs/python.md, Building)")
needs_gpu = unittest.skipUnless(torch is not None and torch.cuda.is_available() and hg.cuda_available(),
                                "SKIPPED: no CUDA GPU present")


def causal_mask(Tq, Tk, dtype=None):
    return torch.full((Tq, Tk), float("-inf"), dtype=dtype).triu(1 + Tk - Tq)


@needs_torch
class Unsupported(unittest.TestCase):
    def test_label_smoothing_and_class_weights_are_refused_by_name(self):
        logits, target = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
        with self.assertRaisesRegex(ValueError, "cross_entropy: label_smoothing=0.1 is not supported"):
            hgt.cross_entropy(logits, target, label_smoothing=0.1)
        with self.assertRaisesRegex(ValueError, "CrossEntropyLoss: label_smoothing=0.1 is not supported"):
            hgt.CrossEntropyLoss(label_smoothing=0.1)
        with self.assertRaisesRegex(ValueError, "class weights"):
            hgt.cross_entropy(logits, target, weight=torch.ones(5))
        # F.cross_entropy's defaults are accepted.
        self.assertAlmostEqual(hgt.cross_entropy(logits, target, label_smoothing=0.0, weight=None).item(),
                               F.cross_entropy(logits, target).item(), places=5)


@needs_torch
class ExtensionNotBuilt(unittest.TestCase):
    """A build without handgrad._torch_ext (no PyTorch C++ headers) says so; it is not a failed import."""

    def run_without_extension(self, env_value):
        package = os.path.dirname(hg.__file__)
        with tempfile.TemporaryDirectory() as root:
            shutil.copytree(package, os.path.join(root, "handgrad"), ignore=shutil.ignore_patterns("_torch_ext*"))
            env = dict(os.environ, PYTHONPATH=root)
            env.pop("HG_TORCH_EXT", None)
            if env_value is not None:
                env["HG_TORCH_EXT"] = env_value
            return subprocess.run([sys.executable, "-W", "always", "-c",
                                   "import handgrad.torch as t; print(t.BACKEND)"],
                                  env=env, capture_output=True, text=True, cwd=root)

    def test_auto_uses_the_python_functions_without_a_warning(self):
        r = self.run_without_extension(None)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "python")
        self.assertNotIn("does not import", r.stderr)

    def test_required_extension_says_it_was_not_built(self):
        r = self.run_without_extension("1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("handgrad._torch_ext was not built", r.stderr)


@needs_torch
class Gradcheck(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)

    def test_layernorm(self):
        x = (torch.randn(3, 4, 9, dtype=torch.float64) * 2 + 50).requires_grad_()
        w = torch.randn(9, dtype=torch.float64, requires_grad=True)
        b = torch.randn(9, dtype=torch.float64, requires_grad=True)
        self.assertTrue(torch.autograd.gradcheck(lambda *a: hgt.layer_norm(*a, 1e-5), (x, w, b)))

    def test_attention_softmax(self):
        s = torch.randn(2, 2, 3, 5, dtype=torch.float64, requires_grad=True)
        pad = torch.zeros(2, 1, 1, 5, dtype=torch.float64)
        pad[1, ..., -1] = float("-inf")
        for mask, causal in [(None, False), (pad, False), (None, True), (pad, True), (causal_mask(3, 5), False)]:
            self.assertTrue(torch.autograd.gradcheck(lambda v: hgt.attention_softmax(v, mask, causal, 0.3), (s,)))

    def test_cross_entropy(self):
        z = torch.randn(7, 6, dtype=torch.float64, requires_grad=True)
        t = torch.tensor([0, 5, -100, 2, 2, 1, -100])
        self.assertTrue(torch.autograd.gradcheck(lambda v: hgt.cross_entropy(v, t) * 3.0, (z,)))


@needs_torch
class MatchesTorch(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(1)

    def check_grads(self, ours, theirs, inputs, rtol, atol):
        a = [t.detach().clone().requires_grad_() for t in inputs]
        b = [t.detach().clone().requires_grad_() for t in inputs]
        ya, yb = ours(*a), theirs(*b)
        torch.testing.assert_close(ya, yb, rtol=rtol, atol=atol)
        g = torch.randn_like(yb)
        ya.backward(g)
        yb.backward(g)
        for u, v in zip(a, b):
            torch.testing.assert_close(u.grad, v.grad, rtol=rtol, atol=atol)

    def test_float32_layernorm_softmax_cross_entropy(self):
        x, w, b = torch.randn(4, 10, 96), torch.randn(96), torch.randn(96)
        self.check_grads(lambda *a: hgt.layer_norm(*a), lambda *a: F.layer_norm(a[0], (96,), a[1], a[2]),
                         [x, w, b], 1e-4, 1e-4)
        s = torch.randn(2, 4, 16, 16) * 3
        self.check_grads(lambda v: hgt.attention_softmax(v, causal=True, scale=0.125),
                         lambda v: torch.softmax(v * 0.125 + causal_mask(16, 16), -1), [s], 1e-5, 1e-6)
        self.check_grads(lambda v: hgt.softmax(v), lambda v: torch.softmax(v, -1), [torch.randn(3, 5, 33)],
                         1e-5, 1e-6)
        z, t = torch.randn(64, 50), torch.randint(0, 50, (64,))
        t[::7] = -100
        self.check_grads(lambda v: hgt.cross_entropy(v, t), lambda v: F.cross_entropy(v, t), [z], 1e-5, 1e-6)

    def test_bool_mask_and_non_contiguous_input(self):
        s = torch.randn(2, 3, 4, 6).transpose(-1, -2)  # (2, 3, 6, 4), not contiguous: copied
        keep = torch.rand(2, 1, 6, 4) > 0.3
        keep[..., 0] = True
        ours = hgt.attention_softmax(s, keep, False, 1.0)
        torch.testing.assert_close(ours, torch.softmax(s.masked_fill(~keep, float("-inf")), -1))

    def test_modules_are_drop_ins(self):
        ln = nn.LayerNorm(32)
        nn.init.normal_(ln.weight)
        ours = hgt.LayerNorm(32)
        ours.load_state_dict(ln.state_dict())
        x = torch.randn(5, 32)
        torch.testing.assert_close(ours(x), ln(x))
        model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Sequential(nn.LayerNorm(32)))
        y0 = model(torch.ones(2, 8))
        hgt.swap_layernorms(model)
        self.assertIsInstance(model[1], hgt.LayerNorm)
        self.assertIsInstance(model[2][0], hgt.LayerNorm)
        torch.testing.assert_close(model(torch.ones(2, 8)), y0)
        loss_fn = hgt.CrossEntropyLoss()
        z = torch.randn(4, 3, requires_grad=True)
        t = torch.tensor([0, 2, 1, 1])
        torch.testing.assert_close(loss_fn(z, t), F.cross_entropy(z, t))
        sm = hgt.AttentionSoftmax(scale=0.5, causal=True)
        torch.testing.assert_close(sm(torch.ones(1, 1, 2, 2)), torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]]))

    def test_training_matches_torch(self):
        """A small LM trained with handgrad's three ops reaches torch's loss step by step."""
        def make(use_hg):
            torch.manual_seed(0)
            emb, ln, head = nn.Embedding(20, 24), nn.LayerNorm(24), nn.Linear(24, 20)
            if use_hg:
                ln = hgt.swap_layernorms(nn.Sequential(ln))[0]
            return emb, ln, head

        def run(use_hg):
            emb, ln, head = make(use_hg)
            params = [*emb.parameters(), *ln.parameters(), *head.parameters()]
            opt = torch.optim.AdamW(params, lr=1e-2)
            g = torch.Generator().manual_seed(0)
            losses = []
            for _ in range(30):
                ids = torch.randint(0, 20, (8, 6), generator=g)
                h = ln(emb(ids))
                att = h @ h.transpose(-1, -2) / math.sqrt(24)
                p = hgt.attention_softmax(att[:, None], causal=True)[:, 0] if use_hg else \
                    torch.softmax(att + causal_mask(6, 6), -1)
                logits = head(p @ h)
                target = (ids + 1) % 20
                loss = hgt.cross_entropy(logits.view(-1, 20), target.view(-1)) if use_hg else \
                    F.cross_entropy(logits.view(-1, 20), target.view(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses

        ours, theirs = run(True), run(False)
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)
        self.assertLess(ours[-1], ours[0] * 0.7)

    def test_errors_cross_as_handgrad_error(self):
        with self.assertRaisesRegex(hg.Error, "layernorm_forward"):
            hgt.layer_norm(torch.randn(2, 4), torch.ones(5), torch.zeros(5))
        with self.assertRaisesRegex(hg.Error, "BF16 on the CPU"):
            hgt.layer_norm(torch.randn(2, 4, dtype=torch.bfloat16), torch.ones(4), torch.zeros(4))
        with self.assertRaisesRegex(hg.Error, "int64 is not supported"):
            hg.from_dlpack(torch.arange(3))
        with self.assertRaisesRegex(hg.Error, "integer class ids"):
            hgt.cross_entropy(torch.randn(2, 3), torch.tensor([0.0, 1.0]))
        with self.assertRaisesRegex(hg.Error, "target 9"):
            hgt.cross_entropy(torch.randn(2, 3), torch.tensor([0, 9]))
        with self.assertRaisesRegex(hg.Error, "does not broadcast"):
            hgt.attention_softmax(torch.randn(2, 2, 3, 3), torch.zeros(2, 2, 3, 3), False, 1.0)
        with self.assertRaises(ValueError):
            hgt.softmax(torch.randn(2, 3), dim=0)


@needs_torch
class FastPath(unittest.TestCase):
    """The drop-ins hand torch.Tensors to handgrad._C's _torch_* entry points, which read their
    pointers, check them and write into outputs torch allocated: no DLPack for LayerNorm and
    softmax. Every bad argument must raise, never crash or touch memory out of bounds."""

    def setUp(self):
        torch.manual_seed(3)

    def test_gradcheck_paths_not_covered_above(self):
        x = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
        self.assertTrue(torch.autograd.gradcheck(lambda v: hgt.softmax(v), (x,)))
        self.assertTrue(torch.autograd.gradcheck(lambda v: hgt.layer_norm(v, None, None), (x,)))
        w = torch.randn(7, dtype=torch.float64, requires_grad=True)
        self.assertTrue(torch.autograd.gradcheck(lambda v, u: hgt.layer_norm(v, u, None), (x, w)))
        xt = torch.randn(7, 4, dtype=torch.float64).t().requires_grad_()  # not contiguous: copied
        self.assertTrue(torch.autograd.gradcheck(lambda v: hgt.layer_norm(v, w.detach(), None), (xt,)))
        z = torch.randn(5, 4, dtype=torch.float64).t().requires_grad_()
        self.assertTrue(torch.autograd.gradcheck(lambda v: hgt.cross_entropy(v, torch.tensor([0, 3, 1, 2])), (z,)))

    def test_layernorm_and_softmax_use_no_dlpack(self):
        def refuse(*_):
            raise AssertionError("DLPack used")
        saved = hgt._from_capsule, torch.utils.dlpack.to_dlpack
        hgt._from_capsule = torch.utils.dlpack.to_dlpack = refuse
        try:
            x = torch.randn(3, 16, requires_grad=True)
            w, b = torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)
            s = torch.randn(1, 2, 4, 4, requires_grad=True)
            (hgt.layer_norm(x, w, b).sum() + hgt.attention_softmax(s, causal=True).pow(2).sum()).backward()
        finally:
            hgt._from_capsule, torch.utils.dlpack.to_dlpack = saved
        x2, w2, b2, s2 = (t.detach().clone().requires_grad_() for t in (x, w, b, s))
        (F.layer_norm(x2, (16,), w2, b2).sum() + torch.softmax(s2 + causal_mask(4, 4), -1).pow(2).sum()).backward()
        for ours, theirs in [(x, x2), (w, w2), (b, b2), (s, s2)]:
            torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-5)

    def test_unfused_mode_writes_into_torchs_outputs(self):
        x = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
        w, b = torch.randn(12, dtype=torch.float64), torch.randn(12, dtype=torch.float64)
        s = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
        with hg.kernels("unfused"):
            self.assertTrue(torch.autograd.gradcheck(lambda v: hgt.layer_norm(v, w, b), (x,)))
            self.assertTrue(torch.autograd.gradcheck(lambda v: hgt.attention_softmax(v, causal=True, scale=0.7), (s,)))

    def test_parameter_dtypes_come_back(self):
        x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
        w = torch.randn(5, requires_grad=True)  # float32 weight on float64 input: cast, grad float32
        y = hgt.layer_norm(x, w, None)
        y.sum().backward()
        self.assertEqual((y.dtype, x.grad.dtype, w.grad.dtype), (torch.float64, torch.float64, torch.float32))

    def test_bad_arguments_raise(self):
        C = hg._C
        x, w, b, y = torch.randn(2, 4), torch.ones(4), torch.zeros(4), torch.empty(2, 4)
        cases = [
            (lambda: C._torch_layernorm_forward(torch.randn(4, 2).t(), w, b, 1e-5, y), "not contiguous"),
            (lambda: C._torch_layernorm_forward(x.long(), w, b, 1e-5, y), "dtype torch.int64"),
            (lambda: C._torch_layernorm_forward(x, w, b, 1e-5, torch.empty(2, 5)), "output y"),
            (lambda: C._torch_layernorm_forward(x, w, b, 1e-5, torch.empty(2, 4, dtype=torch.float64)), "output y"),
            (lambda: C._torch_layernorm_forward(x, torch.ones(5), b, 1e-5, y), "gamma shape"),
            (lambda: C._torch_layernorm_forward(x, w, np.zeros(4, np.float32), 1e-5, y), "must be a torch.Tensor"),
            (lambda: C._torch_layernorm_forward(x, w, None, 1e-5, y), "must be a torch.Tensor"),
            (lambda: C._torch_layernorm_forward(torch.empty(2, 4, device="meta"), w, b, 1e-5, y), "is on meta"),
            (lambda: C._torch_layernorm_forward(torch.empty(2, 0), w, b, 1e-5, torch.empty(2, 0)), "empty"),
            (lambda: C._torch_layernorm_forward(torch.tensor(1.0), w, b, 1e-5, torch.tensor(1.0)), "at least one dim"),
            (lambda: C._torch_softmax_forward(x, None, True, 1.0, y), "causal=True needs scores"),
            (lambda: C._torch_softmax_forward(x, None, False, 1.0, torch.empty(8)), "must have the shape"),
            (lambda: C._torch_softmax_forward(x.view(1, 1, 2, 4), None, False, 1.0, torch.empty(1, 1, 2, 5)),
             "output y"),
            (lambda: C._torch_softmax_backward(y, x, 1.0, torch.empty(3, 4)), "output dx"),
            (lambda: C._torch_softmax_backward(torch.randn(2, 5), x, 1.0, y), "differs from y"),
            (lambda: C._torch_cross_entropy_forward(x, torch.tensor([0, 1]), -100), "dtype torch.int64"),
            (lambda: C._torch_cross_entropy_forward(x, torch.zeros(3), -100), "targets"),
            (lambda: hgt.layer_norm(x.half(), w, b), "dtype f16"),
            (lambda: hgt.attention_softmax(x, torch.zeros(2, 4)), "needs scores"),
        ]
        for call, message in cases:
            with self.subTest(message):
                with self.assertRaisesRegex(hg.Error, message):
                    call()
        saved = C._torch_layernorm_forward(x, w, b, 1e-5, y)
        with self.assertRaisesRegex(hg.Error, "saved mean shape"):  # saved state of another x
            C._torch_layernorm_backward(torch.ones(3, 4), torch.ones(3, 4), w, saved, torch.empty(3, 4), w.clone(),
                                        w.clone())
        with self.assertRaisesRegex(hg.Error, "output dgamma"):
            C._torch_layernorm_backward(y, x, w, saved, torch.empty(2, 4), torch.empty(5), torch.empty(4))
        with self.assertRaises(TypeError):  # pybind11: not a LayerNormSaved
            C._torch_layernorm_backward(y, x, w, None, torch.empty(2, 4), torch.empty(4), torch.empty(4))

    def test_second_backward_raises_instead_of_reading_freed_memory(self):
        z = torch.randn(4, 3, requires_grad=True)
        for loss in (hgt.cross_entropy(z, torch.tensor([0, 1, 2, 1])), hgt.layer_norm(z, None, None).sum(),
                     hgt.softmax(z).pow(2).sum()):
            loss.backward()
            with self.assertRaisesRegex(RuntimeError, "second time"):
                loss.backward()

    @unittest.skipUnless(torch is not None and torch.cuda.is_available() and not hg.cuda_available(),
                         "SKIPPED: needs a CUDA PyTorch with a handgrad built without CUDA")
    def test_cuda_tensor_without_cuda_build(self):
        x = torch.randn(2, 4, device="cuda")
        with self.assertRaisesRegex(hg.Error, "built without CUDA"):
            hgt.layer_norm(x, torch.ones(4, device="cuda"), torch.zeros(4, device="cuda"))


def inputs(seed, *specs):
    """Fresh tensors from a fixed seed, so that two calls give the same values: each spec is
    (shape, dtype, scale, offset, requires_grad)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g, dtype=dtype) * scale + offset).requires_grad_(grad)
            for shape, dtype, scale, offset, grad in specs]


@needs_ext
class CppExtension(unittest.TestCase):
    """handgrad._torch_ext's C++ autograd Functions (what handgrad.torch uses where the extension
    was built) against PyTorch's autograd and against the Python autograd Functions
    (handgrad.torch.python_functions): both reach the same handgrad kernels through the same
    checks, so outputs and gradients must agree bit for bit, and bad input must raise the same
    exception with the same message."""

    def setUp(self):
        self.ext, self.py = hgt._ext, hgt.python_functions

    def test_handgrad_torch_uses_the_extension(self):
        self.assertEqual(hgt.BACKEND, "c++")
        for name in ("layer_norm", "attention_softmax", "softmax", "cross_entropy"):
            self.assertIs(getattr(hgt, name), getattr(self.ext, name))
        y = hgt.LayerNorm(8)(torch.randn(2, 8, requires_grad=True))
        self.assertNotIsInstance(y.grad_fn, torch.autograd.function.BackwardCFunction)  # no Python node

    def test_gradcheck_float64(self):
        E = self.ext
        x, w, b = inputs(0, ((3, 4, 9), torch.float64, 2, 50, True), ((9,), torch.float64, 1, 0, True),
                         ((9,), torch.float64, 1, 0, True))
        self.assertTrue(torch.autograd.gradcheck(lambda *a: E.layer_norm(*a, 1e-5), (x, w, b)))
        self.assertTrue(torch.autograd.gradcheck(lambda v: E.layer_norm(v, None, None), (x,)))
        self.assertTrue(torch.autograd.gradcheck(lambda v, u: E.layer_norm(v, u, None, 1e-3), (x, w)))
        s, = inputs(1, ((2, 2, 3, 5), torch.float64, 1, 0, True))
        pad = torch.zeros(2, 1, 1, 5, dtype=torch.float64)
        pad[1, ..., -1] = float("-inf")
        for mask, causal in [(None, False), (pad, False), (None, True), (pad, True), (causal_mask(3, 5), False)]:
            self.assertTrue(torch.autograd.gradcheck(lambda v: E.attention_softmax(v, mask, causal, 0.3), (s,)))
        xt = torch.randn(7, 4, dtype=torch.float64).t().requires_grad_()  # not contiguous: copied
        self.assertTrue(torch.autograd.gradcheck(lambda v: E.softmax(v), (xt,)))
        z, = inputs(2, ((7, 6), torch.float64, 1, 0, True))
        t = torch.tensor([0, 5, -100, 2, 2, 1, -100])
        self.assertTrue(torch.autograd.gradcheck(lambda v: E.cross_entropy(v, t) * 3.0, (z,)))
        z3, = inputs(3, ((2, 3, 4), torch.float64, 1, 0, True))
        t3 = torch.tensor([[0, 3, 1], [-1, 2, -1]])
        self.assertTrue(torch.autograd.gradcheck(lambda v: E.cross_entropy(v, t3, ignore_index=-1), (z3,)))
        with hg.kernels("unfused"):
            self.assertTrue(torch.autograd.gradcheck(lambda *a: E.layer_norm(*a), (x, w, b)))
            self.assertTrue(torch.autograd.gradcheck(lambda v: E.attention_softmax(v, pad, True, 0.7), (s,)))
            self.assertTrue(torch.autograd.gradcheck(lambda v: E.cross_entropy(v, t), (z,)))

    def test_float32_against_torch(self):
        x, w, b = inputs(4, ((4, 10, 96), torch.float32, 1, 0, True), ((96,), torch.float32, 1, 0, True),
                         ((96,), torch.float32, 1, 0, True))
        ours, ref = self.ext.layer_norm(x, w, b), F.layer_norm(x, (96,), w, b)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
        g = torch.randn_like(ref)
        for a, c in zip(torch.autograd.grad(ours, (x, w, b), g), torch.autograd.grad(ref, (x, w, b), g)):
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)
        s, = inputs(5, ((2, 4, 16, 16), torch.float32, 3, 0, True))
        ours, ref = self.ext.attention_softmax(s, causal=True, scale=0.125), torch.softmax(s * 0.125 + causal_mask(16, 16), -1)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
        g = torch.randn_like(ref)
        torch.testing.assert_close(torch.autograd.grad(ours, s, g)[0], torch.autograd.grad(ref, s, g)[0],
                                   rtol=1e-5, atol=1e-6)
        z, = inputs(6, ((64, 50), torch.float32, 1, 0, True))
        t = torch.randint(0, 50, (64,), generator=torch.Generator().manual_seed(0))
        t[::7] = -100
        ours, ref = self.ext.cross_entropy(z, t), F.cross_entropy(z, t)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.autograd.grad(ours * 2, z)[0], torch.autograd.grad(ref * 2, z)[0],
                                   rtol=1e-5, atol=1e-6)

    def assert_paths_agree(self, name, make_args, **kwargs):
        """`name` on fresh, identical inputs through the C++ and the Python Function: the output
        and every input's gradient are bit for bit the same."""
        results = []
        for impl in (self.ext, self.py):
            args = make_args()
            out = getattr(impl, name)(*args, **kwargs)
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype))
            results.append([out.detach()] + [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad])
        for ours, theirs in zip(*results):
            self.assertEqual((ours.dtype, ours.shape), (theirs.dtype, theirs.shape))
            self.assertTrue(torch.equal(ours, theirs), f"{name}: the C++ and Python paths differ")
        return results[0]

    def test_paths_agree_bit_for_bit_on_hostile_inputs(self):
        f32, f64 = torch.float32, torch.float64
        for dtype in (f32, f64):
            with self.subTest(dtype=dtype):
                def ln_args():  # large offset, a constant row, odd width
                    x, w, b = inputs(10, ((3, 5, 33), dtype, 100, 1e4, True), ((33,), dtype, 1, 0, True),
                                     ((33,), dtype, 1, 0, True))
                    with torch.no_grad():
                        x[1, 2] = 7.0
                    return [x, w, b]
                self.assert_paths_agree("layer_norm", ln_args)
                self.assert_paths_agree("layer_norm", lambda: inputs(11, ((6, 1), dtype, 1, 3, True)) + [None, None])
                self.assert_paths_agree("layer_norm", lambda: inputs(12, ((4, 257), dtype, 1, 0, True),
                                                                     ((257,), f32, 1, 0, True)) + [None], eps=1e-3)

                def masked_scores():  # bool mask that hides every key of one query row, causal, Tq < Tk
                    s, = inputs(13, ((2, 3, 5, 7), dtype, 30, 1e3, True))
                    keep = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
                    keep[1, 0, 2] = False
                    return [s, keep]
                out = self.assert_paths_agree("attention_softmax", masked_scores, causal=True, scale=0.37)[0]
                self.assertTrue(torch.equal(out[1, :, 2], torch.zeros_like(out[1, :, 2])))  # fully masked: zeros
                self.assert_paths_agree("attention_softmax", lambda: inputs(14, ((1, 2, 4, 4), dtype, 1, 0, True)) +
                                        [causal_mask(4, 4, dtype)], scale=2.0)
                self.assert_paths_agree("softmax", lambda: inputs(15, ((4, 3, 257), dtype, 50, -1e4, True)))

                def ce_args(ignore_all=False):
                    z, = inputs(16, ((9, 7), dtype, 10, 100, True))
                    t = torch.tensor([0, 6, -100, 3, 3, 1, -100, 2, 5])
                    return [z, torch.full_like(t, -100) if ignore_all else t]
                self.assert_paths_agree("cross_entropy", ce_args)
                loss, grad = self.assert_paths_agree("cross_entropy", lambda: ce_args(ignore_all=True))
                self.assertEqual((loss.item(), grad.abs().max().item()), (0.0, 0.0))  # nothing counts: 0, not 0/0
        with hg.kernels("unfused"):
            self.assert_paths_agree("layer_norm", ln_args)
            self.assert_paths_agree("cross_entropy", ce_args)

    def test_kernel_mode_reaches_the_extension(self):
        """The extension runs the handgrad inside handgrad._C (one per process), so handgrad's kernel
        mode applies to it: unfused differs from fused in the last bits here, and the C++ path in
        unfused mode matches the Python path in unfused mode."""
        x, w, b = inputs(20, ((64, 96), torch.float32, 3, 5, False), ((96,), torch.float32, 1, 0, False),
                         ((96,), torch.float32, 1, 0, False))
        fused = self.ext.layer_norm(x, w, b)
        with hg.kernels("unfused"):
            unfused, python_unfused = self.ext.layer_norm(x, w, b), self.py.layer_norm(x, w, b)
        self.assertTrue(torch.equal(unfused, python_unfused))
        self.assertFalse(torch.equal(unfused, fused))

    def test_same_errors_as_the_python_functions(self):
        meta = dict(device="meta")
        x, w, b = torch.randn(2, 4), torch.ones(4), torch.zeros(4)
        s = torch.randn(2, 2, 3, 3)
        cases = [  # (op, args, kwargs, part of the message)
            ("layer_norm", (x, torch.ones(5), torch.zeros(5)), {}, "gamma shape"),
            ("layer_norm", (x.to(torch.bfloat16), w, b), {}, "BF16 on the CPU"),
            ("layer_norm", (x.half(), w, b), {}, "dtype f16"),
            ("layer_norm", (x.long(), w, b), {}, "x has dtype torch.int64"),
            ("layer_norm", (torch.empty(2, 4, **meta), w, b), {}, "x is on meta"),
            ("layer_norm", (x, torch.ones(4, **meta), b), {}, "weight is on meta"),
            ("layer_norm", (torch.empty(2, 0), None, None), {}, "empty"),
            ("layer_norm", (torch.tensor(1.0), None, None), {}, "at least one dim"),
            ("layer_norm", (x, w, b, 0.0), {}, "eps"),
            ("attention_softmax", (x, torch.zeros(2, 4)), {}, "a mask needs scores"),
            ("attention_softmax", (x,), dict(causal=True), "causal=True needs scores"),
            ("attention_softmax", (s, torch.zeros(2, 2, 3, 3)), {}, "does not broadcast"),
            ("attention_softmax", (s, torch.zeros(2, 1, 3, 3, **meta)), {}, "mask is on meta"),
            ("attention_softmax", (s,), dict(scale=float("nan")), "scale"),
            ("attention_softmax", (s.to(torch.bfloat16),), {}, "CPU"),
            ("attention_softmax", (torch.empty(0, 3),), {}, "non-empty"),
            ("softmax", (x,), dict(dim=0), "last dim only"),
            ("cross_entropy", (x, torch.tensor([0.0, 1.0])), {}, "integer class ids, got torch.float32"),
            ("cross_entropy", (x, torch.tensor([0, 9])), {}, "target 9"),
            ("cross_entropy", (x, torch.tensor([0, 1, 2])), {}, "targets"),
            ("cross_entropy", (torch.randn(2, 0), torch.tensor([0, 1])), {}, "empty class dim"),
            ("cross_entropy", (x, torch.tensor([0, 1])), dict(reduction="sum"), "reduction='mean' only, got 'sum'"),
            ("cross_entropy", (x, torch.tensor([0, 1], **meta)), {}, "target is on meta"),
        ]
        for name, args, kwargs, message in cases:
            with self.subTest(name=name, message=message):
                raised = []
                for impl in (self.ext, self.py):
                    with self.assertRaises(Exception) as caught:
                        getattr(impl, name)(*args, **kwargs)
                    raised.append(caught.exception)
                ours, theirs = raised
                self.assertIs(type(ours), type(theirs))
                self.assertEqual(str(ours), str(theirs))
                self.assertIsInstance(ours, ValueError)  # handgrad.Error is a ValueError too
                self.assertIn(message, str(ours))
        with self.assertRaises(TypeError):  # not a tensor: pybind11's argument check
            self.ext.layer_norm(np.zeros((2, 4), np.float32), w, b)

    def test_backward_errors_and_second_backward(self):
        for impl in (self.ext, self.py):
            z = torch.randn(4, 3, requires_grad=True)
            with self.assertRaisesRegex(hg.Error, "upstream gradient inf is not finite"):  # raised in the backward
                (impl.cross_entropy(z, torch.tensor([0, 1, 2, 1])) * float("inf")).backward()
            for loss in (impl.cross_entropy(z, torch.tensor([0, 1, 2, 1])), impl.layer_norm(z, None, None).sum(),
                         impl.softmax(z).pow(2).sum()):
                loss.backward()
                with self.assertRaisesRegex(RuntimeError, "second time"):
                    loss.backward()

    def test_in_place_change_of_a_saved_input_is_caught(self):
        x = torch.randn(3, 8, requires_grad=True)
        h = x * 1.0
        y = self.ext.layer_norm(h, None, None)
        h.add_(1.0)  # the backward would read the changed x
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            y.sum().backward()

    def test_parameter_dtypes_and_none_gradients(self):
        x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
        w = torch.randn(5, requires_grad=True)  # float32 weight on float64 input: cast, grad float32
        y = self.ext.layer_norm(x, w, None)
        y.sum().backward()
        self.assertEqual((y.dtype, x.grad.dtype, w.grad.dtype), (torch.float64, torch.float64, torch.float32))
        keep = torch.ones(1, 1, 2, 2, dtype=torch.float32, requires_grad=True)  # a mask gets no gradient
        s = torch.randn(1, 1, 2, 2, requires_grad=True)
        self.ext.attention_softmax(s, keep).sum().backward()
        self.assertIsNone(keep.grad)
        self.assertIsNotNone(s.grad)
        z = torch.randn(3, 4, dtype=torch.float16, requires_grad=True)  # float16 logits: float32 math, f16 grad
        self.ext.cross_entropy(z, torch.tensor([1, 2, 3])).backward()
        self.assertEqual(z.grad.dtype, torch.float16)

    def test_env_switch(self):
        code = "import handgrad.torch as t; print(t.BACKEND)"
        env = dict(os.environ)
        for value, expected in [("0", "python"), ("1", "c++"), ("auto", "c++")]:
            env["HG_TORCH_EXT"] = value
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            self.assertEqual((out.returncode, out.stdout.strip()), (0, expected), out.stderr)
        env["HG_TORCH_EXT"] = "yes"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("HG_TORCH_EXT must be 'auto', '0'", out.stderr)


@needs_torch
class TorchDLPack(unittest.TestCase):
    def test_zero_copy_both_ways(self):
        t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        h = hg.from_dlpack(t)
        self.assertEqual(h.data_ptr(), t.data_ptr())
        t[0, 0] = 42
        self.assertEqual(h.tolist_flat()[0], 42)
        back = torch.utils.dlpack.from_dlpack(h)
        self.assertEqual(back.data_ptr(), t.data_ptr())
        del t, h
        self.assertEqual(back[0, 0].item(), 42)
        with self.assertRaisesRegex(hg.Error, "not contiguous"):
            hg.from_dlpack(torch.zeros(3, 4).t())


@needs_gpu
class Cuda(unittest.TestCase):
    def test_cuda_dlpack_zero_copy_and_streams(self):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.randn(256, 1024, device="cuda")
            y = x * 2  # queued on s; handgrad must see it finished
            h = hg.from_dlpack(y, stream=s.cuda_stream)
            self.assertEqual(h.device, "cuda")
            self.assertEqual(h.data_ptr(), y.data_ptr())
            back = torch.utils.dlpack.from_dlpack(hg.softmax_forward(h))
        torch.cuda.synchronize()
        torch.testing.assert_close(back, torch.softmax(x * 2, -1))

    def test_cuda_ops_match_torch_fp32_and_bf16(self):
        """bf16 bounds: inputs and upstream grads are the same bf16 values on both sides; what
        differs is handgrad rounding its outputs to bf16 (relative 2^-8) after float32 math."""
        torch.manual_seed(2)
        for dtype, rtol, atol in [(torch.float32, 1e-4, 1e-4), (torch.bfloat16, 2e-2, 5e-2)]:
            x = torch.randn(8, 33, 200, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.randn(200, device="cuda", requires_grad=True)
            b = torch.randn(200, device="cuda", requires_grad=True)
            ref = F.layer_norm(x.float(), (200,), w, b)
            ours = hgt.layer_norm(x, w, b)
            self.assertEqual(ours.dtype, dtype)
            torch.testing.assert_close(ours.float(), ref, rtol=rtol, atol=atol)
            g = torch.randn_like(ref).to(dtype)
            gx_ref, gw_ref = torch.autograd.grad(ref, (x, w), g.float())
            gx, gw = torch.autograd.grad(ours, (x, w), g)
            torch.testing.assert_close(gx.float(), gx_ref.float(), rtol=rtol, atol=atol)
            torch.testing.assert_close(gw, gw_ref, rtol=1e-3, atol=1e-3)  # float32 sums of the same products
            s = torch.randn(2, 4, 64, 64, device="cuda", dtype=dtype, requires_grad=True)
            ref = torch.softmax(s.float() * 0.125 + causal_mask(64, 64).cuda(), -1)
            ours = hgt.attention_softmax(s, causal=True, scale=0.125)
            self.assertEqual(ours.dtype, dtype)
            torch.testing.assert_close(ours.float(), ref, rtol=rtol, atol=atol)
            up = torch.randn_like(ref).to(dtype)
            gs_ref, = torch.autograd.grad(ref, s, up.float())
            gs, = torch.autograd.grad(ours, s, up)
            torch.testing.assert_close(gs.float(), gs_ref.float(), rtol=rtol, atol=atol)
        z = torch.randn(512, 1000, device="cuda", requires_grad=True)
        t = torch.randint(0, 1000, (512,), device="cuda")
        loss = hgt.cross_entropy(z, t)
        torch.testing.assert_close(loss, F.cross_entropy(z, t))
        (loss * 3).backward()
        z2 = z.detach().clone().requires_grad_()
        (F.cross_entropy(z2, t) * 3).backward()
        torch.testing.assert_close(z.grad, z2.grad)

    def test_handgrad_runs_on_torchs_current_stream(self):
        """handgrad.torch moves handgrad's work onto PyTorch's current stream, so no events are
        needed between them; results stay right on a side stream and back on the default one."""
        x = torch.randn(64, 512, device="cuda", requires_grad=True)
        w, b = torch.randn(512, device="cuda"), torch.randn(512, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = hgt.layer_norm(x * 3, w, b)  # x * 3 is queued on the side stream just before
            self.assertEqual(hg.cuda_stream(), side.cuda_stream)
            y.sum().backward()
        torch.cuda.current_stream().wait_stream(side)
        torch.testing.assert_close(y, F.layer_norm(x * 3, (512,), w, b), rtol=1e-4, atol=1e-4)
        grad = x.grad.clone()
        x.grad = None
        F.layer_norm(x * 3, (512,), w, b).sum().backward()
        torch.testing.assert_close(grad, x.grad, rtol=1e-4, atol=1e-4)
        p = hgt.softmax(torch.randn(4, 100, device="cuda"))
        self.assertEqual(hg.cuda_stream(), torch.cuda.current_stream().cuda_stream)
        torch.testing.assert_close(p.sum(-1), torch.ones(4, device="cuda"))
        hg.set_cuda_stream(None)
        self.assertNotEqual(hg.cuda_stream(), torch.cuda.current_stream().cuda_stream)

    def test_dtypes_under_autocast_match_stock(self):
        """Under bf16 autocast the anchor's LayerNorm gets the float32 residual stream: ours returns
        float32 as F.layer_norm does (no casts added); the softmax reads and writes the bf16 scores."""
        x = torch.randn(4, 64, device="cuda", requires_grad=True)
        w, b = torch.randn(64, device="cuda", requires_grad=True), torch.randn(64, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ours, ref = hgt.layer_norm(x, w, b), F.layer_norm(x, (64,), w, b)
            s = (x[:, None, :, None] * x[:, None, None, :]).to(torch.bfloat16)  # (4, 1, 64, 64)
            p = hgt.attention_softmax(s, causal=True)
        self.assertEqual((ours.dtype, p.dtype), (ref.dtype, torch.bfloat16))
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
        (ours.sum() + p.float().sum()).backward()
        self.assertEqual((x.grad.dtype, w.grad.dtype), (torch.float32, torch.float32))

    def test_cross_entropy_on_cuda_reads_nothing_back(self):
        """On CUDA the targets are counted on the device: a bad target gives a NaN loss (no host
        read, no exception), bf16 logits are read directly and get a bf16 gradient."""
        z = torch.randn(64, 300, device="cuda")
        t = torch.randint(0, 300, (64,), device="cuda")
        t[5] = 300
        self.assertTrue(torch.isnan(hgt.cross_entropy(z, t)).item())
        t[5] = -100
        zb = z.to(torch.bfloat16).requires_grad_()
        loss = hgt.cross_entropy(zb, t)
        self.assertEqual(loss.dtype, torch.float32)
        zf = zb.detach().float().requires_grad_()
        ref = F.cross_entropy(zf, t)
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)  # float32 math on the same bf16 values
        (loss * 2).backward()
        (ref * 2).backward()
        self.assertEqual(zb.grad.dtype, torch.bfloat16)
        torch.testing.assert_close(zb.grad.float(), zf.grad, rtol=1e-2, atol=1e-4)  # bf16 rounding of the gradient


if __name__ == "__main__":
    unittest.main()
