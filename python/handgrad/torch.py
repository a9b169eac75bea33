"""PyTorch drop-ins running handgrad's kernels, with handgrad's hand-written backward.

    import handgrad.torch as hgt
    self.ln = hgt.LayerNorm(d)                          # was nn.LayerNorm(d)
    p = hgt.attention_softmax(q @ k.transpose(-1, -2), scale=d_head ** -0.5, causal=True)
    loss = hgt.cross_entropy(logits.view(-1, V), targets.view(-1))
    hgt.swap_layernorms(model)                          # every nn.LayerNorm of a model, in place

Tensors cross by DLPack without copies (non-contiguous inputs are made
contiguous first, a copy). On CUDA, handgrad's work runs on PyTorch's current
stream (each call moves it there: handgrad.set_cuda_stream), so nothing needs
an event and the host never blocks; cross-entropy checks its targets on the
device (a bad target gives a NaN loss). Dtypes: float32 and float64 on the CPU;
float32 and bfloat16 on CUDA (math in float32). Details and limits: docs/python.md.
"""
import torch
import torch.nn as nn

import handgrad as _hg

__all__ = ["LayerNorm", "AttentionSoftmax", "CrossEntropyLoss", "layer_norm", "attention_softmax",
           "softmax", "cross_entropy", "swap_layernorms"]


# ---- crossing between torch and handgrad (zero-copy) ------------------------------

_to_dlpack = torch.utils.dlpack.to_dlpack  # torch's C function: a capsule (any tensor, grad or not)
_from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # a C call; current_stream() builds objects


def _stream_for(t):
    """Puts handgrad's CUDA work on PyTorch's current stream (a no-op when it is there already)
    and returns that stream in DLPack's numbering (1 = legacy default); None for CPU tensors.
    With both on one stream the DLPack crossings below need no events at all."""
    if not t.is_cuda:
        return None
    s = _raw_stream(t.device.index) if _raw_stream is not None else torch.cuda.current_stream(t.device).cuda_stream
    _hg.set_cuda_stream(s)
    return s or 1


def _to_hg(t, stream):
    if not t.is_contiguous():
        t = t.contiguous()
    # CUDA: handgrad's stream waits for `stream` (no-op when they are one); when handgrad drops
    # the memory, `stream` waits for handgrad's queued reads.
    return _hg.from_dlpack(_to_dlpack(t), stream=stream)


def _to_torch(h, stream):
    return _from_capsule(h.__dlpack__(stream=stream))  # `stream` sees handgrad's finished work


def _math_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- LayerNorm ------------------------------------------------------------------

class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        D = x.shape[-1]
        math = _math_dtype(x.dtype)
        w = torch.ones(D, dtype=math, device=x.device) if weight is None else weight.to(math)
        b = torch.zeros(D, dtype=math, device=x.device) if bias is None else bias.to(math)
        s = _stream_for(x)
        hx, hw = _to_hg(x, s), _to_hg(w, s)
        y, saved = _hg.layernorm_forward(hx, hw, _to_hg(b, s), eps)
        ctx.saved, ctx.hx, ctx.hw = saved, hx, hw  # the backward reuses these views (no new crossings)
        ctx.param_dtypes = (None if weight is None else weight.dtype, None if bias is None else bias.dtype)
        ctx.save_for_backward(x, w)  # for PyTorch's in-place modification check
        return _to_torch(y, s)

    @staticmethod
    def backward(ctx, dy):
        x, _ = ctx.saved_tensors
        s = _stream_for(x)
        dx, dw, db = _hg.layernorm_backward(_to_hg(dy.to(x.dtype), s), ctx.hx, ctx.hw, ctx.saved)
        w_dtype, b_dtype = ctx.param_dtypes
        dw = None if w_dtype is None else _to_torch(dw, s).to(w_dtype)
        db = None if b_dtype is None else _to_torch(db, s).to(b_dtype)
        return _to_torch(dx, s), dw, db, None


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last dim (torch.nn.functional.layer_norm with normalized_shape (D,))."""
    return _LayerNormFunction.apply(x, weight, bias, eps)


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
        s = _stream_for(scores)
        if scores.dim() == 4:
            m = None if mask is None else _to_hg(_additive_mask(mask, scores), s)
            y = _hg.attention_softmax_forward(_to_hg(scores, s), m, causal, scale)
        elif mask is None and not causal:  # any shape: rows of the last dim
            y = _hg.attention_softmax_forward(_to_hg(scores.reshape(1, 1, -1, scores.shape[-1]), s),
                                              None, False, scale).reshape(tuple(scores.shape))
        else:
            raise _hg.Error(f"attention_softmax: a mask or causal=True needs scores (B, H, Tq, Tk), got "
                            f"{tuple(scores.shape)}")
        out = _to_torch(y, s)
        ctx.scale, ctx.hy = scale, y  # the backward reuses handgrad's view of the output
        ctx.save_for_backward(out)  # for PyTorch's in-place modification check
        return out

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        s = _stream_for(y)
        dx = _hg.softmax_backward(_to_hg(dy.to(y.dtype), s), ctx.hy, ctx.scale)
        return _to_torch(dx, s), None, None, None


def attention_softmax(scores, mask=None, causal=False, scale=1.0):
    """softmax(scale * scores + mask) over the last dim, with an optional causal mask
    (key j of query i masked when j > i + Tk - Tq). The mask gets no gradient."""
    return _AttentionSoftmaxFunction.apply(scores, mask, causal, float(scale))


def softmax(x, dim=-1):
    """torch.softmax over the last dim."""
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"handgrad.torch.softmax runs over the last dim only, got dim={dim} for {x.dim()}-d input")
    return attention_softmax(x)


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
        if logits.shape[-1] > 2 ** 24:
            raise _hg.Error(f"cross_entropy: vocabulary {logits.shape[-1]} exceeds 2^24, the largest whose ids "
                            f"float32 holds exactly")
        # float32 math on bfloat16 logits is handgrad's own on CUDA; elsewhere, and for float16,
        # the logits become float32 first, as torch.autocast does for cross_entropy.
        if logits.dtype not in (torch.float32, torch.float64) and not (logits.is_cuda and logits.dtype == torch.bfloat16):
            logits = logits.float()
        s = _stream_for(logits)
        # handgrad keeps class ids as float32 (a small copy of the targets). On CUDA the targets are
        # checked and counted on the device (no host wait): a bad one makes the loss NaN.
        loss, saved = _hg.cross_entropy_forward(_to_hg(logits, s), _to_hg(target.to(torch.float32), s), ignore_index,
                                                on_device=logits.is_cuda)
        ctx.saved = saved
        ctx.is_cuda = logits.is_cuda
        return _to_torch(loss, s)

    @staticmethod
    def backward(ctx, dloss):
        s = _stream_for(dloss)
        if ctx.is_cuda:  # scale on the device: reading dloss on the host would block
            dlogits = _to_torch(_hg.cross_entropy_backward(ctx.saved, 1.0), s) * dloss
        else:
            dlogits = _to_torch(_hg.cross_entropy_backward(ctx.saved, float(dloss)), s)
        return dlogits, None, None


def cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    """Mean cross-entropy of logits (..., V) against integer targets (...) (F.cross_entropy with
    class ids in the last dim; reduction 'mean' only)."""
    if reduction != "mean":
        raise ValueError(f"handgrad.torch.cross_entropy supports reduction='mean' only, got {reduction!r}")
    return _CrossEntropyFunction.apply(logits, target, int(ignore_index))


class CrossEntropyLoss(nn.Module):
    """nn.CrossEntropyLoss(ignore_index=...) for logits (N, V) / (..., V); mean reduction, no
    class weights, no label smoothing."""

    def __init__(self, ignore_index=-100, reduction="mean"):
        super().__init__()
        if reduction != "mean":
            raise ValueError(f"handgrad.torch.CrossEntropyLoss supports reduction='mean' only, got {reduction!r}")
        self.ignore_index = ignore_index

    def forward(self, logits, target):
        return cross_entropy(logits, target, self.ignore_index)
