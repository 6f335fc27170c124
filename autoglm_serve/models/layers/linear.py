"""Linear layers that know how their weights are sharded and loaded.

Each parameter carries a ``weight_loader(param, loaded, shard_id=None)`` so checkpoints with
separate q/k/v or gate/up tensors load into our fused parameters, and tensor parallelism only
changes which slice a rank keeps. How the weight is stored and multiplied is a ``LinearMethod``:
unquantized here; W4A16/W8A16 and FP8 methods live in autoglm_serve/quantization/. Unquantized weights are multiplied
by the decode GEMV kernel (kernels/gemv.py) when a few rows meet them on CUDA, else by F.linear.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from autoglm_serve.kernels import fused_kernels_on
from autoglm_serve.models.layers.activation import silu_and_mul
from autoglm_serve.models.layers.parallel_state import tp_rank, tp_world_size

if TYPE_CHECKING:     # kernels/ imports Triton, which a CPU install may lack
    from autoglm_serve.kernels.fp8_rows import Fp8Rows


class LinearMethod:
    # whether ``apply`` takes ``fp8_rows``, its input already quantized to e4m3 per token
    # (kernels/fp8_rows.Fp8Rows): an FP8 method, whose producer (a fused RMSNorm) then
    # quantizes the rows on the way
    takes_fp8_rows = False

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int,
                       dtype: torch.dtype | None) -> None:
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
              fp8_rows: Fp8Rows | None = None) -> torch.Tensor:
        """x @ weight^T + bias. fp8_rows: x quantized per token by the kernel that wrote it, or
        None (where ``takes_fp8_rows``, the method then quantizes x itself)."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once the checkpoint (or dummy weights) is in: repack, quantize, check."""

    def apply_gated_silu(self, layer: nn.Module, x: torch.Tensor,
                         fp8_rows: Fp8Rows | None = None) -> torch.Tensor | None:
        """silu(gate) * up of a [gate; up] layer in one fused pass, or None where this method has
        no such pass (the caller then applies the layer and SiluAndMul)."""
        return None

    def apply_to_silu_and_mul(self, layer: nn.Module, gate_up: torch.Tensor,
                              bias: torch.Tensor | None) -> torch.Tensor:
        """``apply`` to silu(gate) * up of [gate | up] rows: a method that quantizes its input
        rows computes the product in that pass (down_proj's)."""
        return self.apply(layer, silu_and_mul(gate_up), bias)


def uses_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              gated: bool = False) -> bool:
    """Whether the decode GEMV kernel replaces F.linear here: CUDA, fused kernels on, a few rows."""
    if not fused_kernels_on(x):
        return False
    from autoglm_serve.kernels import gemv
    return gemv.ENABLED and gemv.supports(x, weight, bias, gated)


def dense_linear(x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T + bias for an unquantized weight [N, K]."""
    if uses_gemv(x, weight, bias):
        from autoglm_serve.kernels import gemv
        return gemv.gemv(x, weight, bias)
    return F.linear(x, weight, bias)


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(self, layer, in_features, out_features, dtype):
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype),
                                    requires_grad=False)

    def apply(self, layer, x, bias, fp8_rows=None):
        return dense_linear(x, layer.weight, bias)

    def apply_gated_silu(self, layer, x, fp8_rows=None):
        if layer.bias is not None or not uses_gemv(x, layer.weight, gated=True):
            return None
        from autoglm_serve.kernels import gemv
        return gemv.gated_gemv(x, layer.weight)


class DeferredLinearMethod(LinearMethod):
    """Creates no weights: quantization/install.py gives each layer its method, by name, once
    the model is built (ignore lists and per-module schemes need the layer's name)."""

    def create_weights(self, layer, in_features, out_features, dtype):
        pass

    def apply(self, layer, x, bias, fp8_rows=None):
        raise RuntimeError("this linear layer was never given its quantization method")


def get_linear_method(quantization: str | None) -> LinearMethod:
    """The method of every linear layer before quantization/install.py refines it per layer
    (``quantization``: a method quantization/config.py has already checked)."""
    return UnquantizedLinearMethod() if quantization is None else DeferredLinearMethod()


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, "
                         f"checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


class LinearBase(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool,
                 linear_method: LinearMethod | None, dtype: torch.dtype | None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.params_dtype = dtype
        self.set_linear_method(linear_method or UnquantizedLinearMethod())
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def set_linear_method(self, method: LinearMethod) -> None:
        """(Re)creates the weights as ``method`` stores them; the bias is kept."""
        for name, _ in list(self.named_parameters(recurse=False)):
            if name != "bias":
                delattr(self, name)
        self.linear_method = method
        method.create_weights(self, self.in_features, self.out_features, self.params_dtype)
        for name, param in self.named_parameters(recurse=False):
            if name != "bias" and not hasattr(param, "weight_loader"):
                param.weight_loader = self.weight_loader

    def forward(self, x: torch.Tensor, fp8_rows: Fp8Rows | None = None) -> torch.Tensor:
        return self.linear_method.apply(self, x, self.bias, fp8_rows)

    def weight_loader(self, param, loaded, shard_id=None):
        default_weight_loader(param, loaded)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank keeps its slice of rows."""

    def __init__(self, in_features, out_features, bias=False, linear_method=None, dtype=None):
        self.tp_size = tp_world_size()
        assert out_features % self.tp_size == 0
        super().__init__(in_features, out_features // self.tp_size, bias, linear_method, dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        size = param.shape[0]
        default_weight_loader(param, loaded.narrow(0, tp_rank() * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up of a SiLU MLP)."""

    def __init__(self, in_features, output_sizes: list[int], bias=False, linear_method=None,
                 dtype=None):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias, linear_method, dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        tp = self.tp_size
        if shard_id is None:  # checkpoint already fused (GLM-4's gate_up_proj): split it back
            offset = 0
            for i, size in enumerate(self.output_sizes):
                self.weight_loader(param, loaded.narrow(0, offset, size), i)
                offset += size
            return
        shard = self.output_sizes[shard_id] // tp
        start = sum(self.output_sizes[:shard_id]) // tp
        default_weight_loader(param.data.narrow(0, start, shard),
                              loaded.narrow(0, tp_rank() * shard, shard))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; KV heads are replicated when fewer than ranks."""

    def __init__(self, hidden_size, head_dim, num_heads, num_kv_heads, bias=False,
                 linear_method=None, dtype=None):
        tp = tp_world_size()
        self.head_dim = head_dim
        self.num_heads = num_heads // tp
        self.num_kv_heads = max(1, num_kv_heads // tp)
        self.kv_replicas = max(1, tp // num_kv_heads)
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, out, bias, linear_method, dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        if shard_id is None:
            raise ValueError("QKVParallelLinear loads q, k and v separately (shard_id 'q'/'k'/'v')")
        if shard_id == "q":
            start, size, rank = 0, q, tp_rank()
        else:
            start = q if shard_id == "k" else q + kv
            size, rank = kv, tp_rank() // self.kv_replicas
        default_weight_loader(param.data.narrow(0, start, size), loaded.narrow(0, rank * size, size))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; outputs are summed across ranks (all-reduce)."""

    def __init__(self, in_features, out_features, bias=False, linear_method=None, dtype=None):
        self.tp_size = tp_world_size()
        assert in_features % self.tp_size == 0
        super().__init__(in_features // self.tp_size, out_features, bias, linear_method, dtype)

    def weight_loader(self, param, loaded, shard_id=None):
        if param.dim() == 1:  # bias: added once, after the reduction
            default_weight_loader(param, loaded)
            return
        size = param.shape[1]
        default_weight_loader(param, loaded.narrow(1, tp_rank() * size, size))

    def forward(self, x):
        return self._reduce(self.linear_method.apply(self, x, self._bias()))

    def forward_silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """This layer applied to silu(gate) * up of [gate | up] rows (a gated MLP's down_proj):
        its method may fuse the activation into its input's quantization."""
        return self._reduce(self.linear_method.apply_to_silu_and_mul(self, gate_up,
                                                                     self._bias()))

    def _bias(self):
        return self.bias if tp_rank() == 0 else None     # added once, to the reduced sum

    def _reduce(self, out: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            torch.distributed.all_reduce(out)
        return out
