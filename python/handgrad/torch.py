"""PyTorch drop-ins running handgrad's kernels, with handgrad's hand-written backward.

    import handgrad.torch as hgt
    self.ln = hgt.LayerNorm(d)                          # was nn.LayerNorm(d)
    p = hgt.attention_softmax(q @ k.transpose(-1, -2), scale=d_head ** -0.5, causal=True)
    loss = hgt.cross_entropy(logits.view(-1, V), targets.view(-1))
    hgt.swap_layernorms(model)                          # every nn.LayerNorm of a model, in place

The drop-ins are C++ torch::autograd::Functions from handgrad._torch_ext where
it was built (no Python frame in their forward dispatch or backward), else the
Python autograd.Functions below, with the same semantics; HG_TORCH_EXT=0 picks
the Python ones, HG_TORCH_EXT=1 requires the extension. BACKEND says which.

Tensors cross without copies (non-contiguous inputs are made contiguous
first, a copy): handgrad reads their pointers and writes into outputs torch
allocated. On CUDA, handgrad's work runs on PyTorch's current stream (each
call moves it there), so nothing needs an event and the host never blocks;
cross-entropy checks its targets on the device (a bad target gives a NaN loss). Dtypes: float32 and float64 on the CPU;
float32 and bfloat16 on CUDA (math in float32). Details and limits: docs/python.md.
"""
import importlib.util
import os
import types
import warnings

import torch
import torch.nn as nn

import handgrad as _hg
from handgrad import _C

__all__ = ["LayerNorm", "AttentionSoftmax", "CrossEntropyLoss", "layer_norm", "attention_softmax",
           "softmax", "cross_entropy", "swap_layernorms", "BACKEND"]


def _load_extension():
    """handgrad._torch_ext, or None for the Python Functions. HG_TORCH_EXT: unset or 'auto' (the
    extension where it was built), '0' (the Python Functions), '1' (the extension or ImportError)."""
    choice = os.environ.get("HG_TORCH_EXT", "auto")
    if choice not in ("auto", "0", "1"):
        raise _hg.Error(f"HG_TORCH_EXT must be 'auto', '0' (Python autograd Functions) or '1' (require "
                        f"handgrad._torch_ext), got {choice!r}")
    if choice == "0":
        return None
    # Not built (the build found no PyTorch C++ headers) is a normal state, said as such;
    # built but failing to import is a fault worth a warning.
    if importlib.util.find_spec("handgrad._torch_ext") is None:
        if choice == "1":
            raise ImportError("HG_TORCH_EXT=1, but handgrad._torch_ext was not built (CMake builds it where it finds "
                              "PyTorch's C++ headers: 'PyTorch C++ extension ON' in the configure output)")
        return None
    try:
        from handgrad import _torch_ext
        return _torch_ext
    except ImportError as e:
        if choice == "1":
            raise ImportError(f"HG_TORCH_EXT=1, but handgrad._torch_ext, which was built, does not import: {e}") from e
        warnings.warn(f"handgrad._torch_ext was built but does not import ({e}); using the Python autograd Functions")
        return None


_ext = _load_extension()
BACKEND = "c++" if _ext is not None else "python"


# ---- crossing between torch and handgrad ------------------------------------------
# The drop-ins pass torch.Tensors straight to handgrad._C's _torch_* entry points, which
# read data_ptr()/shape/dtype/device, check them (handgrad.Error) and wrap the memory
# without owning it; outputs are allocated here by torch (its caching allocator, its
# current stream) and written by handgrad's kernels on PyTorch's current stream. The
# torch tensors outlive the queued kernels: see docs/python.md, "Lifetimes". LayerNorm's
# mean/rstd stay handgrad's (in ctx); only cross-entropy's loss and gradient use DLPack.

_hg._C._register_torch(torch.Tensor, (torch.float32, torch.float64, torch.bfloat16, torch.float16),
                       getattr(torch._C, "_cuda_getCurrentRawStream", None))
_from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
_F64 = torch.float64
_F32 = torch.float32


def _to_torch(h):
    """A handgrad tensor as a torch one (DLPack, no copy). handgrad already runs on PyTorch's
    current stream (the _torch_* call that made `h` moved it there), so no event is needed.
    DLPack names the legacy default stream 1 (handgrad's 0); CPU tensors take None."""
    stream = (_hg.cuda_stream() or 1) if h.device == "cuda" else None
    return _from_capsule(h.__dlpack__(stream=stream))


def _math_dtype(dtype):
    return _F64 if dtype is _F64 else _F32


def _as_dtype(t, dtype):
    return t if t.dtype is dtype else t.to(dtype)


# ---- LayerNorm ------------------------------------------------------------------

class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x = x.contiguous()  # the same tensor when it is contiguous already
        math = _math_dtype(x.dtype)
        w = x.new_ones(x.shape[-1:], dtype=math) if weight is None else _as_dtype(weight, math)
        b = x.new_zeros(x.shape[-1:], dtype=math) if bias is None else _as_dtype(bias, math)
        y = torch.empty_like(x)
        ctx.saved = _C._torch_layernorm_forward(x, w, b, eps, y)  # handgrad's mean and rstd per row
        ctx.param_dtypes = (None if weight is None else weight.dtype, None if bias is None else bias.dtype)
        ctx.save_for_backward(x, w)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = _as_dtype(dy, x.dtype).contiguous()
        dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)
        _C._torch_layernorm_backward(dy, x, w, ctx.saved, dx, dw, db)
        w_dtype, b_dtype = ctx.param_dtypes
        dw = None if w_dtype is None else _as_dtype(dw, w_dtype)
        db = None if b_dtype is None else _as_dtype(db, b_dtype)
        return dx, dw, db, None


def _py_layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last dim (torch.nn.functional.layer_norm with normalized_shape (D,))."""
    return _LayerNormFunction.apply(x, weight, bias, eps)


layer_norm = _ext.layer_norm if _ext is not None else _py_layer_norm


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm over the last dim, computed by handgrad. Same parameters and state_dict."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype)
        if len(self.normalized_shape) != 1:
            raise ValueError(f"handgrad.torch.LayerNorm normalizes the last dim only; got normalized_shape "
                             f"{tuple(self.normalized_shape)}")

    def forward(self, x):
        if x.shape[-1:] != self.normalized_shape:
            raise ValueError(f"LayerNorm({self.normalized_shape[0]}) got input of shape {tuple(x.shape)}")
        return layer_norm(x, self.weight, self.bias, self.eps)


def swap_layernorms(model):
    """Replaces every nn.LayerNorm in `model` by handgrad's, sharing its parameters. Returns model."""
    for name, child in list(model.named_children()):
        if type(child) is nn.LayerNorm and len(child.normalized_shape) == 1:
            new = LayerNorm(child.normalized_shape, child.eps, child.elementwise_affine,
                            device=child.weight.device if child.weight is not None else None)
            new.weight, new.bias = child.weight, child.bias
            setattr(model, name, new)
        else:
            swap_layernorms(child)
    return model


# ---- softmax / attention softmax -------------------------------------------------

def _additive_mask(mask, scores):
    """handgrad takes an additive float mask of shape (B,1,1,Tk) or (B,1,Tq,Tk); a bool
    mask (True = attend, like scaled_dot_product_attention) becomes 0 / -inf, and other
    broadcastable shapes are expanded (a copy)."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=_math_dtype(scores.dtype), device=mask.device).masked_fill(
            ~mask, float("-inf"))
    mask = mask.to(_math_dtype(scores.dtype))
    B, _, Tq, Tk = scores.shape
    if mask.dim() == 4 and mask.shape[0] == B and mask.shape[1] == 1 and mask.shape[2] in (1, Tq) \
            and mask.shape[3] == Tk:
        return mask
    try:
        return mask.expand(B, 1, Tq, Tk)
    except RuntimeError:
        raise _hg.Error(f"attention_softmax: mask {tuple(mask.shape)} does not broadcast to (B, 1, Tq, Tk) = "
                        f"{(B, 1, Tq, Tk)} for scores {tuple(scores.shape)} (per-head masks are not supported)")


class _AttentionSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, mask, causal, scale):
        scores = scores.contiguous()
        if mask is not None:
            if scores.dim() != 4:
                raise _hg.Error(f"attention_softmax: a mask needs scores (B, H, Tq, Tk), got {tuple(scores.shape)}")
            mask = _additive_mask(mask, scores).contiguous()
        y = torch.empty_like(scores)
        _C._torch_softmax_forward(scores, mask, causal, scale, y)
        ctx.scale = scale
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy = _as_dtype(dy, y.dtype).contiguous()
        dx = torch.empty_like(y)
        _C._torch_softmax_backward(dy, y, ctx.scale, dx)
        return dx, None, None, None


def _py_attention_softmax(scores, mask=None, causal=False, scale=1.0):
    """softmax(scale * scores + mask) over the last dim, with an optional causal mask
    (key j of query i masked when j > i + Tk - Tq). The mask gets no gradient."""
    return _AttentionSoftmaxFunction.apply(scores, mask, causal, float(scale))


def _py_softmax(x, dim=-1):
    """torch.softmax over the last dim."""
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"handgrad.torch.softmax runs over the last dim only, got dim={dim} for {x.dim()}-d input")
    return _py_attention_softmax(x)


attention_softmax = _ext.attention_softmax if _ext is not None else _py_attention_softmax
softmax = _ext.softmax if _ext is not None else _py_softmax


class AttentionSoftmax(nn.Module):
    """Module form of attention_softmax: AttentionSoftmax(scale, causal)(scores, mask=None)."""

    def __init__(self, scale=1.0, causal=False):
        super().__init__()
        self.scale, self.causal = float(scale), bool(causal)

    def forward(self, scores, mask=None):
        return attention_softmax(scores, mask, self.causal, self.scale)

    def extra_repr(self):
        return f"scale={self.scale}, causal={self.causal}"


# ---- cross-entropy ---------------------------------------------------------------

class _CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index):
        if target.dtype.is_floating_point:
            raise _hg.Error(f"cross_entropy: target must hold integer class ids, got {target.dtype}")
        if logits.dim() > 0 and logits.shape[-1] > 2 ** 24:
            raise _hg.Error(f"cross_entropy: vocabulary {logits.shape[-1]} exceeds 2^24, the largest whose ids "
                            f"float32 holds exactly")
        # float32 math on bfloat16 logits is handgrad's own on CUDA; elsewhere, and for float16,
        # the logits become float32 first, as torch.autocast does for cross_entropy.
        if logits.dtype not in (_F32, _F64) and not (logits.is_cuda and logits.dtype == torch.bfloat16):
            logits = logits.float()
        logits = logits.contiguous()
        # handgrad keeps class ids as float32 (a small copy of the targets). On CUDA the targets are
        # checked and counted on the device (no host wait): a bad one makes the loss NaN.
        target = target.to(_F32).contiguous()
        loss, ctx.saved = _C._torch_cross_entropy_forward(logits, target, ignore_index)
        ctx.save_for_backward(logits, target)  # ctx.saved may view both: they must outlive it
        return _to_torch(loss)

    @staticmethod
    def backward(ctx, dloss):
        logits, _ = ctx.saved_tensors  # raises once PyTorch freed them: ctx.saved is not read then
        if logits.is_cuda:  # scale on the device: reading dloss on the host would block
            return _to_torch(_C._torch_cross_entropy_backward(ctx.saved, logits, 1.0)) * dloss, None, None
        return _to_torch(_C._torch_cross_entropy_backward(ctx.saved, logits, float(dloss))), None, None


def _refuse_unsupported(where, label_smoothing, weight):
    if label_smoothing != 0.0:
        raise ValueError(f"{where}: label_smoothing={float(label_smoothing)!r} is not supported (only 0.0); "
                         "use torch.nn.functional.cross_entropy for label smoothing")
    if weight is not None:
        raise ValueError(f"{where}: class weights (weight=...) are not supported")


def _py_cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, weight=None):
    """Mean cross-entropy of logits (..., V) against integer targets (...) (F.cross_entropy with
    class ids in the last dim; reduction 'mean' only; label_smoothing other than 0 and class
    weights are refused by name)."""
    if reduction != "mean":
        raise ValueError(f"handgrad.torch.cross_entropy supports reduction='mean' only, got {reduction!r}")
    _refuse_unsupported("handgrad.torch.cross_entropy", label_smoothing, weight)
    return _CrossEntropyFunction.apply(logits, target, int(ignore_index))


cross_entropy = _ext.cross_entropy if _ext is not None else _py_cross_entropy


class CrossEntropyLoss(nn.Module):
    """nn.CrossEntropyLoss(ignore_index=...) for logits (N, V) / (..., V); mean reduction, no
    class weights, no label smoothing."""

    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0, weight=None):
        super().__init__()
        _refuse_unsupported("handgrad.torch.CrossEntropyLoss", label_smoothing, weight)
        if reduction != "mean":
            raise ValueError(f"handgrad.torch.CrossEntropyLoss supports reduction='mean' only, got {reduction!r}")
        self.ignore_index = ignore_index

    def forward(self, logits, target):
        return cross_entropy(logits, target, self.ignore_index)


# The Python autograd Functions, whichever BACKEND is in use (tests and benchmarks compare the two).
python_functions = types.SimpleNamespace(layer_norm=_py_layer_norm, attention_softmax=_py_attention_softmax,
                                         softmax=_py_softmax, cross_entropy=_py_cross_entropy)
