"""handgrad.torch against PyTorch autograd: torch.autograd.gradcheck in float64,
float32 against torch's own ops, drop-in modules, DLPack with torch. Skips
visibly without PyTorch; the CUDA cases skip without a GPU."""
import math
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
needs_gpu = unittest.skipUnless(torch is not None and torch.cuda.is_available() and hg.cuda_available(),
                                "SKIPPED: no CUDA GPU present")


def causal_mask(Tq, Tk, dtype=None):
    return torch.full((Tq, Tk), float("-inf"), dtype=dtype).triu(1 + Tk - Tq)


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
