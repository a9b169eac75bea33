"""handgrad from Python.

Tensors share memory with NumPy (``from_numpy``, ``Tensor.numpy()``) and with
any DLPack producer such as PyTorch (``from_dlpack``, ``torch.from_dlpack``),
on the CPU and on CUDA. The ops return what their hand-written backward needs::

    y, saved = handgrad.layernorm_forward(x, gamma, beta, 1e-5)
    dx, dgamma, dbeta = handgrad.layernorm_backward(dy, x, gamma, saved)

``handgrad.torch`` (needs PyTorch) wraps the ops as torch.autograd.Functions
and nn.Module drop-ins. Bad input raises ``handgrad.Error`` (a ValueError and a
RuntimeError) with handgrad's own message. See docs/python.md.
"""
from contextlib import contextmanager as _contextmanager

from ._C import (AdamW, CrossEntropySaved, DecoderLM, Error, Generator, LayerNormSaved, Module,
                 NonFiniteError, Optimizer, Parameter, SGD, StepResult, Tensor, TrainStep,
                 attention_softmax_forward, clip_grad_norm,
                 cross_entropy_backward, cross_entropy_forward, cuda_available, cuda_stream,
                 from_dlpack, from_numpy, full, kernel_mode, layernorm_backward, layernorm_forward,
                 ones, randn, set_kernel_mode, softmax_backward, softmax_forward, zeros,
                 cuda_empty_cache, cuda_memory_limit, cuda_memory_stats, cuda_reset_peak_memory,
                 cuda_set_memory_limit, set_cuda_stream, OutOfMemoryError)

__all__ = [name for name in dir() if not name.startswith("_")] + ["kernels", "tensor"]


@_contextmanager
def kernels(mode):
    """``with handgrad.kernels("unfused"): ...`` runs the ops as primitive passes, then restores the mode."""
    previous = kernel_mode()
    set_kernel_mode(mode)
    try:
        yield
    finally:
        set_kernel_mode(previous)


def tensor(data, dtype="float32", device="cpu"):
    """A new tensor holding a copy of ``data`` (nested lists, NumPy arrays, numbers)."""
    import numpy as np
    host = np.array(data, dtype=np.float64, order="C")  # always a copy
    return from_numpy(host).to(dtype).to(device)
