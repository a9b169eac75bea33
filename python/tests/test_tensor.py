"""Tensor metadata, zero-copy NumPy and DLPack exchange, and errors that never crash."""
import gc
import unittest

import numpy as np

import handgrad as hg


class TensorBasics(unittest.TestCase):
    def test_metadata_and_factories(self):
        t = hg.zeros((2, 3), "float64")
        self.assertEqual(t.shape, (2, 3))
        self.assertEqual(t.dtype, "float64")
        self.assertEqual(t.device, "cpu")
        self.assertEqual(t.ndim, 2)
        self.assertEqual(t.numel(), 6)
        self.assertEqual(t.nbytes, 48)
        self.assertEqual(repr(t), "Tensor([[0, 0, 0], [0, 0, 0]], dtype=float64)")  # small: the values
        np.testing.assert_array_equal(hg.ones(4).numpy(), np.ones(4, np.float32))
        np.testing.assert_array_equal(hg.full((2,), 2.5).numpy(), [2.5, 2.5])
        r = hg.randn((1000,), hg.Generator(3))
        self.assertLess(abs(float(r.numpy().mean())), 0.15)
        np.testing.assert_array_equal(hg.randn((5,), hg.Generator(3)).numpy(), r.numpy()[:5])

    def test_tensor_copies_and_casts(self):
        data = np.arange(6, dtype=np.float64).reshape(2, 3)
        t = hg.tensor(data)
        data[0, 0] = 100
        self.assertEqual(t.dtype, "float32")
        np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
        self.assertEqual(t.to("bfloat16").to("float32").numpy()[1, 2], 5.0)
        self.assertEqual(t.reshape(3, 2).shape, (3, 2))
        self.assertEqual(t.reshape((6,)).shape, (6,))


class NumpyZeroCopy(unittest.TestCase):
    def test_from_numpy_shares_memory_both_ways(self):
        for dtype, name in [(np.float32, "float32"), (np.float64, "float64"), (np.float16, "float16")]:
            a = np.arange(12, dtype=dtype).reshape(3, 4)
            t = hg.from_numpy(a)
            self.assertEqual(t.dtype, name)
            self.assertEqual(t.data_ptr(), a.ctypes.data)
            a[1, 2] = -7
            self.assertEqual(t.numpy()[1, 2], -7)
            t.fill_(3)
            self.assertTrue((a == 3).all())

    def test_tensor_keeps_array_alive_and_numpy_keeps_tensor_alive(self):
        a = np.full((1000,), 1.5, np.float32)
        t = hg.from_numpy(a)
        del a
        gc.collect()
        self.assertEqual(t.numpy().sum(), 1500.0)
        view = hg.full((8,), 4.0).numpy()   # the Tensor object is gone; the view holds it
        gc.collect()
        self.assertTrue((view == 4.0).all())
        self.assertTrue((np.asarray(hg.full((3,), 2.0)) == 2.0).all())  # __array_interface__

    def test_numpy_view_is_zero_copy(self):
        t = hg.zeros((2, 2))
        v = t.numpy()
        self.assertEqual(v.ctypes.data, t.data_ptr())
        v[0, 1] = 9
        self.assertEqual(t.tolist_flat(), [0, 9, 0, 0])

    def test_rejected_arrays_raise_not_crash(self):
        with self.assertRaisesRegex(hg.Error, "int64 is not supported"):
            hg.from_numpy(np.arange(3))
        with self.assertRaisesRegex(hg.Error, "not C-contiguous"):
            hg.from_numpy(np.zeros((4, 4), np.float32).T)
        with self.assertRaisesRegex(hg.Error, "not C-contiguous"):
            hg.from_numpy(np.zeros(8, np.float32)[::2])
        ro = np.zeros(3, np.float32)
        ro.flags.writeable = False
        with self.assertRaisesRegex(hg.Error, "read-only"):
            hg.from_numpy(ro)
        with self.assertRaisesRegex(hg.Error, "native byte order"):
            hg.from_numpy(np.zeros(3, ">f4"))
        with self.assertRaisesRegex(hg.Error, "not aligned"):
            hg.from_numpy(np.frombuffer(bytearray(17), np.float32, count=4, offset=1))
        with self.assertRaisesRegex(hg.Error, "bfloat16"):
            hg.zeros(3, "bfloat16").numpy()
        with self.assertRaisesRegex(hg.Error, "unknown dtype 'int8'"):
            hg.zeros(3, "int8")
        with self.assertRaisesRegex(hg.Error, "unknown device"):
            hg.zeros(3, device="tpu")
        with self.assertRaises(hg.Error):
            hg.zeros((2, -1))
        with self.assertRaises(hg.Error):
            hg.zeros(6).reshape(4, 2)
        with self.assertRaises(TypeError):
            hg.from_numpy("not an array")

    @unittest.skipIf(hg.cuda_available(), "a GPU is present")
    def test_cuda_request_without_a_gpu_raises(self):
        # CPU-only build: "... built without CUDA"; CUDA build, no GPU: the CUDA runtime's error.
        with self.assertRaisesRegex(hg.Error, "(?i)cuda"):
            hg.zeros(3, device="cuda")

    @unittest.skipUnless(hg.cuda_available(), "SKIPPED: no CUDA GPU present")
    def test_cuda_tensors_refuse_numpy_and_round_trip_through_dlpack(self):
        t = hg.full((2, 3), 1.5, device="cuda")
        with self.assertRaisesRegex(hg.Error, "lives on the GPU"):
            t.numpy()
        self.assertEqual(t.__dlpack_device__(), (2, 0))
        u = hg.from_dlpack(t)
        self.assertEqual(u.data_ptr(), t.data_ptr())
        self.assertEqual(u.device, "cuda")
        self.assertEqual(u.to("cpu").tolist_flat(), [1.5] * 6)

    def test_error_class(self):
        self.assertTrue(issubclass(hg.Error, ValueError))
        self.assertTrue(issubclass(hg.Error, RuntimeError))
        self.assertTrue(issubclass(hg.OutOfMemoryError, hg.Error))
        self.assertTrue(issubclass(hg.OutOfMemoryError, MemoryError))

    @unittest.skipUnless(hg.cuda_available(), "SKIPPED: no CUDA GPU present")
    def test_cuda_memory_limit(self):
        hg.cuda_empty_cache()
        held = hg.cuda_memory_stats()["reserved"]
        hg.cuda_set_memory_limit(held + (16 << 20))
        try:
            self.assertEqual(hg.cuda_memory_limit(), held + (16 << 20))
            kept = hg.zeros(1 << 20, device="cuda")  # 4 MiB: within the limit
            with self.assertRaisesRegex(hg.OutOfMemoryError, "set_memory_limit"):
                hg.zeros(8 << 20, device="cuda")  # 32 MiB more
            self.assertEqual(kept.to("cpu").tolist_flat()[:2], [0.0, 0.0])
        finally:
            hg.cuda_set_memory_limit(0)
        self.assertEqual(hg.cuda_memory_limit(), 0)
        self.assertEqual(hg.zeros(8 << 20, device="cuda").shape, (8 << 20,))

    @unittest.skipUnless(hg.cuda_available(), "SKIPPED: no CUDA GPU present")
    def test_cuda_memory_stats_requested(self):
        before = hg.cuda_memory_stats()
        t = hg.zeros(1000, device="cuda")  # 4000 bytes: 4096 requested (512-byte units)
        now = hg.cuda_memory_stats()
        self.assertEqual(now["requested"] - before["requested"], 4096)
        self.assertGreaterEqual(now["in_use"] - before["in_use"], 4096)
        self.assertGreaterEqual(now["peak_requested"], now["requested"])
        del t
        gc.collect()
        self.assertEqual(hg.cuda_memory_stats()["requested"], before["requested"])


class DLPackExchange(unittest.TestCase):
    def test_numpy_to_handgrad_zero_copy(self):
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        t = hg.from_dlpack(a)
        self.assertEqual(t.shape, (2, 3))
        self.assertEqual(t.data_ptr(), a.ctypes.data)
        del a
        gc.collect()
        self.assertEqual(t.tolist_flat(), [0, 1, 2, 3, 4, 5])

    @unittest.skipUnless(hasattr(np, "from_dlpack"), "NumPy without from_dlpack")
    def test_handgrad_to_numpy_zero_copy(self):
        t = hg.full((3, 2), 1.0, "float64")
        a = np.from_dlpack(t)
        self.assertEqual(a.dtype, np.float64)
        self.assertEqual(a.ctypes.data, t.data_ptr())
        del t
        gc.collect()
        self.assertEqual(a.sum(), 6.0)
        self.assertEqual(hg.from_dlpack(hg.zeros(0)).shape, (0,))
        self.assertEqual(np.from_dlpack(hg.full((), 2.0)).item(), 2.0)

    def test_capsules_and_versions(self):
        t = hg.ones((2,))
        cap = t.__dlpack__()
        u = hg.from_dlpack(cap)
        self.assertEqual(u.data_ptr(), t.data_ptr())
        with self.assertRaisesRegex(hg.Error, "already consumed"):
            hg.from_dlpack(cap)
        versioned = t.__dlpack__(max_version=(1, 0))
        self.assertEqual(hg.from_dlpack(versioned).data_ptr(), t.data_ptr())
        unused = [t.__dlpack__(max_version=(1, 0)), t.__dlpack__()]
        del unused  # capsules nobody consumed free their tensors
        self.assertEqual(t.__dlpack_device__(), (1, 0))
        copied = hg.from_dlpack(t.__dlpack__(copy=True))
        self.assertNotEqual(copied.data_ptr(), t.data_ptr())
        with self.assertRaisesRegex(hg.Error, "cross-device"):
            t.__dlpack__(dl_device=(2, 0))

    def test_rejected_dlpack_inputs(self):
        with self.assertRaisesRegex(hg.Error, "int64 is not supported"):
            hg.from_dlpack(np.arange(4))
        with self.assertRaisesRegex(hg.Error, "not contiguous"):
            hg.from_dlpack(np.zeros((3, 3), np.float32).T)
        with self.assertRaisesRegex(hg.Error, "expected an object with __dlpack__"):
            hg.from_dlpack([1.0, 2.0])


if __name__ == "__main__":
    unittest.main()
