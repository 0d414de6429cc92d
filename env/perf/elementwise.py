"""The element-wise work of one decoder layer: which kernels, and the bytes each one is counted to move.

One definition, read by the composition (:func:`env.perf.model.elementwise_bytes_per_token` sums it), by the
measurement (:mod:`env.perf.measure` times each op alone and writes its bytes to ``elementwise.csv``) and by the
profile loader (which checks the file's ``bytes`` column against it). Torch-free.

An unfused PyTorch Llama layer with bf16 activations runs, per token (``d`` hidden size; widths per GPU of a TP
group, ``d_ff / tp``, ``d_q / tp`` and the KV heads held, ``d_kv``):

=====================  =====  =====  ==================================================================
op                     calls  width  bytes per element of the width (read + written)
=====================  =====  =====  ==================================================================
``rmsnorm_cast_fp32``  2      d      6: read bf16 2, write fp32 4
``rmsnorm_square``     2      d      8: fp32 in, fp32 out
``rmsnorm_mean``       2      d      4: fp32 in (the one value per token written is not counted)
``rmsnorm_scale``      2      d      8: fp32 times the per-token reciprocal root, fp32 out
``rmsnorm_cast_bf16``  2      d      6: read fp32 4, write bf16 2
``rmsnorm_weight``     2      d      4: bf16 in, bf16 out (the weight vector is not counted)
``residual_add``       2      d      6: two bf16 in, one out
``silu``               1      d_ff   4: the gate half of the gate/up output in, bf16 out
``silu_mul``           1      d_ff   6: SiLU output and the up half in, bf16 out
``q_copy``             1      d_q    4: q out of the fused QKV output into heads-first layout
``attn_out_copy``      1      d_q    4: attention output back to tokens-first layout
``kv_cache_write``     2      d_kv   4: K (and V) written into the cache
=====================  =====  =====  ==================================================================

That is ``2 x 36 d + 2 x 6 d + 10 d_ff / tp + 8 d_q / tp + 8 d_kv`` bytes per token per layer. The RMSNorm's
``+ eps`` and ``rsqrt`` act on one value per token: they move no counted bytes, and their cost (a minimum kernel
duration) is part of the per-layer launch cost, not of this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from env.perf.profile import ModelSpec

__all__ = ["ELEMENTWISE_OPS", "ElementwiseOp", "elementwise_op"]

Width = Literal["hidden", "ffn", "q", "kv"]


@dataclass(frozen=True, slots=True)
class ElementwiseOp:
    """One element-wise kernel of a decoder layer.

    Attributes:
        name: the ``op`` value of ``elementwise.csv``.
        calls_per_layer: how many times a layer runs it.
        width: the per-token tensor it walks: ``hidden`` (d), ``ffn`` (d_ff / tp), ``q`` (d_q / tp) or ``kv``
            (the KV heads one GPU holds x head dim).
        bytes_per_element: bytes read plus written per element of that width.
    """

    name: str
    calls_per_layer: int
    width: Width
    bytes_per_element: int

    def width_elements(self, model: ModelSpec, tp: int = 1) -> float:
        """Elements of the op's width per token on one GPU of a TP group."""
        if self.width == "hidden":
            return float(model.hidden_size)
        if self.width == "ffn":
            return model.ffn_size / tp
        if self.width == "q":
            return model.num_q_heads * model.head_dim / tp
        return float(max(model.num_kv_heads // tp, 1) * model.head_dim)

    def bytes_per_token(self, model: ModelSpec, tp: int = 1) -> float:
        """Bytes one call moves per token on one GPU of a TP group."""
        return self.bytes_per_element * self.width_elements(model, tp)


ELEMENTWISE_OPS: tuple[ElementwiseOp, ...] = (
    ElementwiseOp("rmsnorm_cast_fp32", 2, "hidden", 6),
    ElementwiseOp("rmsnorm_square", 2, "hidden", 8),
    ElementwiseOp("rmsnorm_mean", 2, "hidden", 4),
    ElementwiseOp("rmsnorm_scale", 2, "hidden", 8),
    ElementwiseOp("rmsnorm_cast_bf16", 2, "hidden", 6),
    ElementwiseOp("rmsnorm_weight", 2, "hidden", 4),
    ElementwiseOp("residual_add", 2, "hidden", 6),
    ElementwiseOp("silu", 1, "ffn", 4),
    ElementwiseOp("silu_mul", 1, "ffn", 6),
    ElementwiseOp("q_copy", 1, "q", 4),
    ElementwiseOp("attn_out_copy", 1, "q", 4),
    ElementwiseOp("kv_cache_write", 2, "kv", 4),
)
"""The element-wise kernels of one unfused PyTorch Llama layer (see the module doc)."""

_BY_NAME = {op.name: op for op in ELEMENTWISE_OPS}


def elementwise_op(name: str) -> ElementwiseOp:
    """The op called ``name``.

    Raises:
        KeyError: no such op (the message lists the known ones).
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown element-wise op {name!r} (known: {', '.join(_BY_NAME)})") from None
