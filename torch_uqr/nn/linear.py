"""``QuantLinear``: an inference-only ``nn.Linear`` whose weight stays in a packed format.

The forward pass is one call of the router (``torch.ops.uqr.gemm`` through ``torch_uqr.gemm``);
the weight is never expanded to float in memory.  The state dict holds only tensors
(packed bytes, the format name as ASCII bytes, and the shape) so it can be written with
safetensors and loaded back bit-exactly, even into a QuantLinear of another format or size.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..formats.table import spec as format_spec
from ..qtensor import QTensor, quantize

__all__ = ["QuantLinear", "save_quantized", "load_quantized"]


def _encode_fmt(fmt: str) -> torch.Tensor:
    return torch.tensor(list(fmt.encode("ascii")), dtype=torch.uint8)


def _decode_fmt(t: torch.Tensor) -> str:
    """The format name stored as ASCII bytes; anything else is a ValueError."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1:
        raise ValueError(f"weight_format must be a 1-D uint8 tensor of ASCII bytes, got "
                         f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    raw = bytes(t.cpu().tolist())
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"weight_format must hold an ASCII format name, got bytes {raw[:40]!r}") from None


def _decode_shape(t: torch.Tensor) -> tuple[int, int, int, int]:
    """(N, K, group_size, in_features) from the weight_shape buffer."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or tuple(t.shape) != (4,):
        raise ValueError(f"weight_shape must be an int64 tensor [N, K, group_size, in_features], got "
                         f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    N, K, gs, in_features = (int(v) for v in t.tolist())
    return N, K, gs, in_features


def _weight_key(w: torch.Tensor) -> tuple:
    """Identifies the bytes a weight tensor holds: its storage, and its in-place write count."""
    try:
        version = w._version
    except RuntimeError:  # an inference tensor: no version counter (read-only outside inference mode)
        version = -1
    return (w.data_ptr(), w.device, w.shape, version)


@torch.library.custom_op("uqr::linear_gemm", mutates_args=())
def _linear_gemm(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int, out_heads: int,
                 in_heads: bool, path: str) -> torch.Tensor:
    """``uqr::gemm`` after validating ``w``'s blocks, again whenever they changed since the last check.

    QuantLinear's forward under ``torch.compile``: opaque to the tracer, it reads the weight's
    version counter at run time, which a compiled graph's guards do not look at. The record of
    the last check rides on the tensor object, so it is shared by every module using that weight.
    """
    key = (_weight_key(w), fmt, N, K, group_size)
    if getattr(w, "_uqr_checked", None) != key:
        QTensor._validated(w, fmt, (N, K), group_size or None)
        w._uqr_checked = key
    return torch.ops.uqr.gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, path)


@_linear_gemm.register_fake
def _linear_gemm_fake(x, w, fmt, N, K, group_size, out_heads, in_heads, path):
    return torch.ops.uqr.gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, path)


class QuantLinear(nn.Module):
    """y = x Wᵀ + b with W packed in one of ``torch_uqr.formats()``.

    Args:
        qt: the packed weight, shape ``(out_features, K)``. K may exceed ``in_features`` when the
            weight was zero-padded to a whole number of blocks (``in_features`` then says how many
            columns are real; the input is zero-padded on the fly).
        bias: optional float bias of length ``out_features``.
        out_heads: if > 0, the output is written as ``[..., out_heads, M, D]`` (direct-head layout).
        in_heads: if True, the input is ``[..., H, M, D]`` with ``H*D == in_features``.
        path: router path, ``"auto"`` (default), ``"mma"``, ``"vec"`` (ternary only) or ``"int8"``
            (formats that have it; see ``torch_uqr.gemm``).
        in_features: real input width (defaults to ``qt.K``).
        path_max_rows: if set, ``path`` serves calls of at most this many activation rows (decode
            steps) and larger calls (prefill) take ``"auto"``.
    """

    def __init__(self, qt: QTensor, bias: Optional[torch.Tensor] = None, *, out_heads: int = 0,
                 in_heads: bool = False, path: Optional[str] = None, in_features: Optional[int] = None,
                 path_max_rows: Optional[int] = None):
        super().__init__()
        N, K = qt.shape
        in_features = K if in_features is None else int(in_features)
        if not 0 < in_features <= K:
            raise ValueError(f"in_features must be in 1..{K} (the packed weight's K), got {in_features}")
        self.register_buffer("weight", qt.data)
        self.register_buffer("weight_format", _encode_fmt(qt.fmt))
        self.register_buffer("weight_shape", torch.tensor([N, K, int(qt.group_size or 0), in_features],
                                                          dtype=torch.int64))
        if bias is not None:
            bias = bias.detach().to(device=qt.data.device)
            if bias.shape != (N,) or not bias.is_floating_point():
                raise ValueError(f"bias must be a float tensor of shape ({N},), got {bias.dtype} {tuple(bias.shape)}")
        self.register_buffer("bias", bias)
        self._refresh_meta()
        self.out_heads = int(out_heads or 0)
        self.in_heads = bool(in_heads)
        self.path = path
        self.path_max_rows = path_max_rows
        self._cache: tuple = (None, None)
        self._check_heads()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_qtensor(cls, qt: QTensor, bias: Optional[torch.Tensor] = None, **kwargs) -> "QuantLinear":
        """Wrap an existing QTensor (e.g. from a loader) without touching its bytes."""
        return cls(qt, bias, **kwargs)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str, *, pad: bool = False, **opts) -> "QuantLinear":
        """Quantize ``linear.weight`` into ``fmt`` (``opts`` go to ``torch_uqr.quantize``).

        With ``pad=True`` an in_features that is not a multiple of the format's block size is
        zero-padded up to one (the extra columns meet zero-padded inputs, so they never change y).
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        K = w.shape[1]
        if pad:
            block = block_size_of(fmt, **opts)
            w = F.pad(w, (0, -K % block))
        kwargs = {k: opts.pop(k) for k in ("out_heads", "in_heads", "path") if k in opts}
        qt = quantize(w.float(), fmt, **opts)
        return cls(qt, linear.bias, in_features=K, **kwargs)

    # ---- properties ---------------------------------------------------------------------
    def _refresh_meta(self) -> None:
        # Python copies of the metadata buffers: reading tensors on every forward costs more
        # than the small-M gemm itself.
        self._fmt = _decode_fmt(self.weight_format)
        self._N, self._K, self._gs, self._in = (int(v) for v in self.weight_shape.tolist())

    @property
    def fmt(self) -> str:
        return self._fmt

    @property
    def out_features(self) -> int:
        return self._N

    @property
    def packed_in_features(self) -> int:
        return self._K

    @property
    def in_features(self) -> int:
        return self._in

    @property
    def group_size(self) -> int:
        return self._gs

    def _unchecked_qtensor(self) -> QTensor:
        return QTensor(self.weight, self._fmt, (self._N, self._K), self._gs)

    @property
    def qtensor(self) -> QTensor:
        """The packed weight as a QTensor over the ``weight`` buffer, validated like ``from_bytes``.

        Validated again whenever the buffer changes: another tensor assigned (its storage), or an
        in-place write through the tensor or a view of it (its autograd version counter). Writes
        that bypass the version counter (through ``weight.data`` or memory shared with another
        library) are not seen; the kernels stay memory-safe on any bytes regardless.
        """
        w = self.weight
        key = _weight_key(w)
        if self._cache[0] != key:
            kw = {"group_size": self._gs} if format_spec(self._fmt).grouped else {}
            self._cache = (key, QTensor._validated(w, self._fmt, (self._N, self._K), **kw))
        return self._cache[1]

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per real weight (zero padding counts against the format)."""
        return self.weight.numel() * 8 / (self.out_features * self.in_features)

    def _check_heads(self) -> None:
        if self.out_heads and self.out_features % self.out_heads:
            raise ValueError(f"out_heads={self.out_heads} does not divide out_features={self.out_features}")
        if self.in_heads and self.packed_in_features != self.in_features:
            raise ValueError("in_heads=True cannot be used with a zero-padded weight "
                             f"(in_features {self.in_features} < packed K {self.packed_in_features})")

    # ---- forward ------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_in_features != self.in_features:
            x = F.pad(x, (0, self.packed_in_features - self.in_features))
        heads = self.out_heads or None
        path = self.path
        if self.path_max_rows is not None and x.numel() > self.path_max_rows * self.packed_in_features:
            path = None  # more rows than path serves (prefill): the default route
        if torch.compiler.is_compiling():
            # The check of the weight's bytes runs inside the op, on the real buffer at every
            # call: nothing per layer for dynamo to guard on, and a weight changed after
            # compilation is still validated before a kernel reads it.
            y = torch.ops.uqr.linear_gemm(*ops.gemm_args(x, self._unchecked_qtensor(), heads, self.in_heads, path))
        else:
            y = ops.gemm(x, self.qtensor, out_heads=heads, in_heads=self.in_heads, path=path)
        if self.bias is not None:
            b = self.bias.to(y.dtype)
            if self.out_heads:
                b = b.view(self.out_heads, 1, -1)
            y = y + b
        return y

    # ---- state dict ---------------------------------------------------------------------
    def _check_incoming(self, state_dict, prefix) -> None:
        """Validate what a state dict would give this module, as the constructor would, before
        anything is copied: bytes, format, shape, bias and heads must agree."""
        get = lambda name: state_dict.get(prefix + name, getattr(self, name))  # noqa: E731
        fmt = _decode_fmt(get("weight_format"))
        N, K, gs, in_features = _decode_shape(get("weight_shape"))
        weight = get("weight")
        if not isinstance(weight, torch.Tensor):
            raise ValueError(f"weight must be a uint8 tensor, got {type(weight).__name__}")
        kw = {"group_size": gs} if format_spec(fmt).grouped else {}
        if not kw and gs != 0:
            raise ValueError(f"weight_shape's group_size is {gs}, but {fmt} has no group size (expected 0)")
        # Validated on the incoming tensor itself (no copy): it is about to be copied into our buffer.
        QTensor._validated(weight.detach(), fmt, (N, K), **kw)
        if not 0 < in_features <= K:
            raise ValueError(f"weight_shape's in_features must be in 1..{K} (the packed K), got {in_features}")
        has_bias = prefix + "bias" in state_dict or (self.bias is not None and prefix + "weight" not in state_dict)
        if has_bias:
            bias = get("bias")
            if not isinstance(bias, torch.Tensor) or not bias.is_floating_point() or tuple(bias.shape) != (N,):
                raise ValueError(f"bias must be a float tensor of shape ({N},) (out_features), got "
                                 f"{getattr(bias, 'dtype', type(bias).__name__)} {tuple(getattr(bias, 'shape', ()))}")
        if self.out_heads and N % self.out_heads:
            raise ValueError(f"out_heads={self.out_heads} does not divide out_features={N}")
        if self.in_heads and in_features != K:
            raise ValueError("in_heads=True cannot be used with a zero-padded weight "
                             f"(in_features {in_features} < packed K {K})")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if any(prefix + n in state_dict for n in ("weight", "weight_format", "weight_shape", "bias")):
            try:
                self._check_incoming(state_dict, prefix)
            except ValueError as e:
                # The same error type as the constructor's; the module is left as it was.
                raise ValueError(f"{prefix or 'QuantLinear'}: state dict refused: {e}") from None
        # A QuantLinear may receive another format's bytes: resize our buffers first so the
        # stock loader copies instead of failing on a shape mismatch.
        for name in ("weight", "weight_format", "weight_shape", "bias"):
            src = state_dict.get(prefix + name)
            mine = getattr(self, name)
            if src is not None and (mine is None or mine.shape != src.shape or mine.dtype != src.dtype):
                device = self.weight.device
                setattr(self, name, torch.empty(src.shape, dtype=src.dtype, device=device))
        if prefix + "bias" not in state_dict and self.bias is not None and prefix + "weight" in state_dict:
            self.bias = None
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self._cache = (None, None)
        self._refresh_meta()

    def extra_repr(self) -> str:
        s = (f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}, "
             f"bpw={self.bits_per_weight:.2f}, bias={self.bias is not None}")
        if format_spec(self.fmt).grouped:
            s += f", group_size={self.group_size}"
        if self.packed_in_features != self.in_features:
            s += f", padded_to={self.packed_in_features}"
        if self.out_heads:
            s += f", out_heads={self.out_heads}"
        if self.in_heads:
            s += ", in_heads=True"
        return s


def block_size_of(fmt: str, **opts) -> int:
    """Elements per block of ``fmt`` along K (an MLX-family format: its group size, default 64)."""
    from ..formats import block_geometry

    return block_geometry(fmt, opts.get("group_size"))[0]


def save_quantized(module: nn.Module, path: str) -> None:
    """Write a module's state dict (QuantLinear buffers included) to a safetensors file."""
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(sd, path, metadata={"producer": "torch_uqr"})


def load_quantized(module: nn.Module, path: str, strict: bool = True) -> nn.Module:
    """Load a file written by ``save_quantized`` into ``module`` (QuantLinears adapt their format)."""
    from safetensors.torch import load_file

    module.load_state_dict(load_file(path), strict=strict)
    return module
