"""A DecoderLM training step from Python: forward, loss, backward, AdamW step; the same as one TrainStep call."""
import os
import tempfile
import unittest

import numpy as np

import handgrad as hg


def batch(rng, B, T, V):
    """Sequences counting up modulo V from a random start: next token = token + 1."""
    start = rng.integers(0, V, size=(B, 1))
    seq = (start + np.arange(T + 1)[None, :]) % V
    return hg.tensor(seq[:, :-1]), hg.tensor(seq[:, 1:])


class Training(unittest.TestCase):
    def make(self):
        return hg.DecoderLM(vocab_size=16, max_seq_len=8, d_model=32, n_heads=2, n_layers=1, seed=0)

    def test_loss_falls_and_parameters_move(self):
        model = self.make()
        names = [n for n, _ in model.named_parameters()]
        self.assertIn("head.weight", names)
        self.assertEqual(model.num_parameters(), sum(p.value.numel() for p in model.parameters()))
        opt = hg.AdamW(model, lr=3e-3, weight_decay=0.0)
        step = hg.TrainStep(model, opt)
        head = dict(model.named_parameters())["head.weight"].value.numpy()  # a live view
        before = head.copy()
        rng = np.random.default_rng(0)
        losses = [step.run(*batch(rng, 8, 8, 16)).loss for _ in range(80)]
        self.assertEqual(model.forward(batch(rng, 8, 8, 16)[0]).shape, (8, 8, 16))
        self.assertEqual(opt.steps, 80)
        self.assertGreater(losses[0], 2.0)       # ~ log(16) = 2.77 at initialisation
        self.assertLess(np.mean(losses[-5:]), 0.3, losses[-5:])
        self.assertFalse(np.array_equal(head, before))  # step() updated the values the view sees

    def test_train_step_is_the_op_by_op_step(self):
        """TrainStep (the library's step) gives the losses, norms and parameters of the sequence above, bitwise."""
        a, b = self.make(), self.make()
        opt_a = hg.AdamW(a, lr=3e-3, max_grad_norm=1.0)
        opt_b = hg.AdamW(b, lr=3e-3, max_grad_norm=1.0)
        step = hg.TrainStep(a, opt_a)
        self.assertIn("off", step.graph_note)  # CUDA graphs need a CUDA model
        rng = np.random.default_rng(3)
        for k in range(4):
            ids, targets = batch(rng, 4, 8, 16)
            opt_a.lr = opt_b.lr = 1e-3 * (k + 1)  # the schedule stays the caller's
            r = step.run(ids, targets)
            loss, saved = hg.cross_entropy_forward(b.forward(ids), targets, -100)
            b.zero_grad()
            b.backward(hg.cross_entropy_backward(saved))
            opt_b.step()
            self.assertEqual(r.step, k + 1)
            self.assertEqual(r.loss, loss.item())
            self.assertEqual(r.grad_norm, opt_b.last_grad_norm)
        for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
            np.testing.assert_array_equal(pa.value.numpy(), pb.value.numpy(), err_msg=name)

    def test_train_step_stops_on_a_non_finite_loss(self):
        model = self.make()
        opt = hg.AdamW(model, lr=3e-3)
        step = hg.TrainStep(model, opt)
        ids, targets = batch(np.random.default_rng(4), 2, 8, 16)
        step.run(ids, targets)
        bias = dict(model.named_parameters())["head.bias"].value.numpy()
        bias[0] = np.inf
        before = bias.copy()
        with self.assertRaises(hg.NonFiniteError) as caught:
            step.run(ids, targets)
        self.assertIsInstance(caught.exception, hg.Error)
        self.assertIn("step 2", str(caught.exception))
        np.testing.assert_array_equal(bias, before)  # parameters unchanged
        self.assertEqual(opt.steps, 1)

    def test_grad_accum_is_the_whole_batch(self):
        """grad_accum=4: micro-batches of 2 rows, one optimizer step, the losses of the batch of 8."""
        a, b = self.make(), self.make()
        opt_a = hg.AdamW(a, lr=3e-3, max_grad_norm=1.0)
        opt_b = hg.AdamW(b, lr=3e-3, max_grad_norm=1.0)
        accum, whole = hg.TrainStep(a, opt_a, grad_accum=4), hg.TrainStep(b, opt_b)
        rng = np.random.default_rng(5)
        for _ in range(3):
            ids, targets = batch(rng, 8, 8, 16)
            t = targets.numpy().copy()
            t[:3, :5] = -100  # uneven counted targets across the micro-batches
            targets = hg.tensor(t)
            ra, rb = accum.run(ids, targets), whole.run(ids, targets)
            self.assertAlmostEqual(ra.loss, rb.loss, delta=1e-5 * rb.loss)
            self.assertAlmostEqual(ra.grad_norm, rb.grad_norm, delta=1e-5 * rb.grad_norm)
        self.assertEqual(opt_a.steps, 3)
        with self.assertRaises(hg.Error):
            accum.run(*batch(rng, 6, 8, 16))  # 6 rows do not split into 4 micro-batches
        with self.assertRaises(hg.Error):
            hg.TrainStep(a, opt_a, grad_accum=0)

    def test_save_load_round_trip(self):
        a, b = self.make(), hg.DecoderLM(vocab_size=16, max_seq_len=8, d_model=32, n_heads=2, n_layers=1, seed=1)
        ids, _ = batch(np.random.default_rng(1), 2, 8, 16)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "lm.ckpt")
            a.save(path)
            b.load(path)
        np.testing.assert_array_equal(a.forward(ids).numpy(), b.forward(ids).numpy())
        with self.assertRaises(hg.Error):
            b.load(os.path.join(d, "missing.ckpt"))

    @unittest.skipUnless(hg.cuda_available(), "SKIPPED: no CUDA GPU present")
    def test_cuda_step_matches_cpu(self):
        cpu, gpu = self.make(), self.make()
        gpu.to("cuda")
        ids, targets = batch(np.random.default_rng(2), 4, 8, 16)
        losses = []
        for model, dev in [(cpu, "cpu"), (gpu, "cuda")]:
            opt = hg.SGD(model, lr=0.1)  # linear in the gradients: CPU/GPU rounding stays small (AdamW's
            for _ in range(3):           # first steps are ~lr * sign(g), which rounding can flip)
                loss, saved = hg.cross_entropy_forward(model.forward(ids.to(dev)), targets.to(dev), -100)
                model.zero_grad()
                model.backward(hg.cross_entropy_backward(saved))
                opt.step()
            losses.append(loss.item())
        self.assertAlmostEqual(losses[0], losses[1], delta=1e-4)  # float32 on both, different summation orders

    def test_bad_model_input_raises(self):
        model = self.make()
        with self.assertRaises(hg.Error):
            model.forward(hg.tensor([[1, 2, 99]]))   # token id outside the vocabulary
        with self.assertRaises(hg.Error):
            model.forward(hg.zeros((1, 9)))          # longer than max_seq_len
        with self.assertRaises(hg.Error):
            hg.DecoderLM(d_model=30, n_heads=4)      # heads do not divide d_model


if __name__ == "__main__":
    unittest.main()
