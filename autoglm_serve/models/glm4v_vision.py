"""GLM-4.1V vision tower (the ``model.visual`` of AutoGLM-Phone-9B), our own module.

pixel_values [num_patches, C*T*P*P] (rows in merge-window order, as the image processor writes
them) -> image embeddings [num_patches / merge**2, out_hidden] for the text decoder.

Pipeline: patch embedding (the checkpoint's Conv3d with kernel == stride is a Linear over a
flattened patch) -> RMSNorm -> + learned position table resampled (bicubic) to each image's grid
-> ViT blocks with 2-D rotary on (row, col) -> RMSNorm -> 2x2 downsample (the Conv2d with
kernel == stride, again a Linear over 4 adjacent rows) -> patch merger (Linear, LayerNorm, GELU,
SiLU-gated MLP). Attention is full inside each image (each frame) and never across images.

Weight names: ``load_weights`` takes checkpoint names as stored (``model.visual.blocks.0.attn.qkv.weight``);
the ``model.visual.`` (or ``visual.``) prefix is stripped when present, a name without it is taken
as relative to the tower, and names of other modules (``model.language_model.*``, ``lm_head.*``)
are skipped, so a caller may stream the whole checkpoint through it.
"""
from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from autoglm_serve.host_transfer import to_device
from autoglm_serve.kernels import fused_kernels_on
from autoglm_serve.models.layers.activation import SiluAndMul
from autoglm_serve.models.layers.norm import RMSNorm
from autoglm_serve.models.layers.parallel_state import mm_encoder_tp_mode, tp_rank, tp_world_size


# SDPA kernels to try first on CUDA, in order (None: PyTorch's own choice). A phone screenshot
# is one ~12k-token full-attention sequence per block, where the kernels differ most.
SDPA_BACKENDS: list[SDPBackend] | None = None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _all_reduce(x: torch.Tensor, tp: int) -> torch.Tensor:
    """The sum of the ranks' partial outputs of a tower sharded by weights."""
    if tp > 1:
        torch.distributed.all_reduce(x)
    return x


class VisionAttention(nn.Module):
    """tp > 1 (--mm-encoder-tp-mode weights): this rank's heads, the output summed."""

    def __init__(self, hidden: int, num_heads: int, qkv_bias: bool, tp: int = 1):
        super().__init__()
        self.tp = tp
        self.num_heads = num_heads // tp
        self.head_dim = hidden // num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden // tp, bias=qkv_bias)
        self.proj = nn.Linear(hidden // tp, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
        """cos, sin: [N, head_dim // 2] float32, shared by both halves of every head."""
        n = x.shape[0]
        qkv = self.qkv(x).view(n, 3, self.num_heads, self.head_dim)
        if fused_kernels_on(qkv):
            from autoglm_serve.kernels.vision_rotary import rotate_qk_
            q, k, v = rotate_qk_(qkv, cos, sin).unbind(1)
        else:
            q, k, v = qkv.unbind(1)
            # rotary in float32, like the reference, then back to the activation dtype
            c = torch.cat((cos, cos), dim=-1).unsqueeze(1)
            s = torch.cat((sin, sin), dim=-1).unsqueeze(1)
            q = (q.float() * c + _rotate_half(q.float()) * s).to(v.dtype)
            k = (k.float() * c + _rotate_half(k.float()) * s).to(v.dtype)
        out = self.attend(q, k, v, cu_seqlens)
        return _all_reduce(self.proj(out.reshape(n, -1)), self.tp)

    @staticmethod
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
        """Non-causal attention within each segment [cu[i], cu[i+1]); q, k, v, out: [N, heads, D].

        The one place to swap in a varlen kernel (flash-attn style cu_seqlens)."""
        out = torch.empty_like(q)
        prefer = (sdpa_kernel(SDPA_BACKENDS, set_priority=True) if q.is_cuda and SDPA_BACKENDS
                  else nullcontext())
        with prefer:
            for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
                # 4-D [1, heads, L, D]: SDPA's flash and memory-efficient kernels take only 4-D
                # inputs; 3-D ones fall back to the math path, which materializes the L x L
                # scores (12k x 12k per head for a phone screenshot: ~15x slower on an H200).
                seg = [t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
                out[start:end] = F.scaled_dot_product_attention(*seg)[0].transpose(0, 1)
        return out


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up are one fused Linear (gate rows first). With
    tp > 1, this rank's share of the inner width, the output summed."""

    def __init__(self, dim: int, inner: int, tp: int = 1):
        super().__init__()
        self.tp = tp
        self.gate_up = nn.Linear(dim, 2 * inner // tp, bias=False)
        self.down = nn.Linear(inner // tp, dim, bias=False)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _all_reduce(self.down(self.act(self.gate_up(x))), self.tp)


class VisionBlock(nn.Module):
    """x + attn(norm1(x)), then + mlp(norm2(.)), passed on as (last branch output, residual)
    so that every residual add is folded into the norm that follows it (one fused pass on CUDA)."""

    def __init__(self, hidden: int, num_heads: int, mlp_dim: int, eps: float, qkv_bias: bool,
                 tp: int = 1):
        super().__init__()
        self.norm1 = RMSNorm(hidden, eps)
        self.attn = VisionAttention(hidden, num_heads, qkv_bias, tp)
        self.norm2 = RMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, mlp_dim, tp)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, cu_seqlens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, normed = hidden, self.norm1(hidden)
        else:
            normed, residual = self.norm1(hidden, residual)
        normed, residual = self.norm2(self.attn(normed, cos, sin, cu_seqlens), residual)
        return self.mlp(normed), residual


class PatchMerger(nn.Module):
    def __init__(self, dim: int, inner: int, tp: int = 1):
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        self.mlp = GatedMLP(dim, inner, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(F.gelu(self.norm(self.proj(x))))


class VisionEncoding:
    """The tower's state between blocks for one call's images: hidden states, residual, the
    rotary angles, and the next block to run."""

    def __init__(self, tower: Glm4vVisionTower, x: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, cu_seqlens: list[int]):
        self.tower = tower
        self.x, self.residual = x, None
        self.cos, self.sin, self.cu_seqlens = cos, sin, cu_seqlens
        self.next_block = 0

    @property
    def blocks_left(self) -> int:
        return len(self.tower.blocks) - self.next_block

    @property
    def frame_lens(self) -> list[int]:
        return [b - a for a, b in zip(self.cu_seqlens[:-1], self.cu_seqlens[1:])]

    def advance(self, num_blocks: int) -> None:
        for block in self.tower.blocks[self.next_block:self.next_block + num_blocks]:
            self.x, self.residual = block(self.x, self.residual, self.cos, self.sin,
                                          self.cu_seqlens)
            self.next_block += 1

    def result(self) -> torch.Tensor:
        """The image embeddings, once every block has run."""
        if self.blocks_left:
            raise RuntimeError(f"{self.blocks_left} vision blocks have not run yet")
        return self.tower._finish(self.x, self.residual)


class Glm4vVisionTower(nn.Module):
    def __init__(self, vision_config):
        super().__init__()
        c = vision_config
        # sharded like the decoder only under --mm-encoder-tp-mode weights; else replicated
        sharded = mm_encoder_tp_mode() == "weights"
        self.tp = tp_world_size() if sharded else 1
        self.rank = tp_rank() if sharded else 0
        self.hidden = c.hidden_size
        self.out_hidden = c.out_hidden_size
        self.num_heads = c.num_heads
        self.merge = c.spatial_merge_size
        self.patch_dim = c.in_channels * c.temporal_patch_size * c.patch_size ** 2
        self.pos_side = c.image_size // c.patch_size
        rope_theta = float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        head_dim = c.hidden_size // c.num_heads

        self.patch_embed = nn.Linear(self.patch_dim, c.hidden_size, bias=True)
        self.post_conv_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.pos_embed = nn.Parameter(torch.zeros(self.pos_side ** 2, c.hidden_size))
        # GLM's block MLP is out_hidden wide (4096), not intermediate_size; the merger uses the latter
        self.blocks = nn.ModuleList(
            VisionBlock(c.hidden_size, c.num_heads, c.out_hidden_size, c.rms_norm_eps,
                        c.attention_bias, self.tp)
            for _ in range(c.depth)
        )
        self.post_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.downsample = nn.Linear(self.merge ** 2 * c.hidden_size, c.out_hidden_size, bias=True)
        self.merger = PatchMerger(c.out_hidden_size, c.intermediate_size, self.tp)
        self.merger_inner = c.intermediate_size
        # half the head's pairs rotate with the row index, half with the column index
        quarter = torch.arange(0, head_dim // 2, 2, dtype=torch.float) / (head_dim // 2)
        self.register_buffer("inv_freq", 1.0 / (rope_theta ** quarter), persistent=False)
        # (grids, dtype, device) -> (position embeddings, cos, sin) of the last call (_geometry)
        self._last_geometry: tuple | None = None

    # ---- per-call geometry (host side, from grid_thw) ----
    def _patch_rows_cols(self, grid_thw: list[tuple[int, int, int]], device) -> torch.Tensor:
        """(row, col) of every patch, [N, 2], in merge-window order, repeated per frame."""
        m = self.merge
        out = []
        for t, h, w in grid_thw:
            rows = torch.arange(h, device=device).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
            cols = torch.arange(w, device=device).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
            rc = torch.stack([rows.transpose(1, 2).flatten(), cols.transpose(1, 2).flatten()], dim=-1)
            out.append(rc.repeat(t, 1))
        return torch.cat(out)

    def _position_embedding(self, rows_cols: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """Learned side x side table, bicubic-sampled at each patch's centre in its own image's grid."""
        per_image = torch.tensor([[h, w] for _, h, w in grid_thw], dtype=torch.float32)
        counts = torch.tensor([t * h * w for t, h, w in grid_thw])
        # pinned and queued: a pageable copy would wait for all the GPU work in flight
        sizes = to_device(per_image.repeat_interleave(counts, dim=0), torch.float32,
                          rows_cols.device)
        centre = (rows_cols.float() + 0.5) / sizes * 2 - 1          # [-1, 1], align_corners=False
        grid = centre.flip(-1).view(1, -1, 1, 2)                    # grid_sample wants (x=col, y=row)
        table = self.pos_embed.float().t().reshape(1, self.hidden, self.pos_side, self.pos_side)
        sampled = F.grid_sample(table, grid, mode="bicubic", align_corners=False, padding_mode="border")
        return sampled.view(self.hidden, -1).t()

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor | list) -> torch.Tensor:
        encoding = self.begin(pixel_values, grid_thw)
        encoding.advance(len(self.blocks))
        return encoding.result()

    def begin(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor | list) -> VisionEncoding:
        """An encoding of these images that runs its blocks when advanced (the engine spreads
        a screenshot's blocks over several steps, so running decodes are never held for the
        whole tower)."""
        grids = [tuple(int(v) for v in g) for g in (grid_thw.tolist() if torch.is_tensor(grid_thw) else grid_thw)]
        dtype = self.patch_embed.weight.dtype
        device = self.patch_embed.weight.device
        frame_lens = [h * w for t, h, w in grids for _ in range(t)]
        cu_seqlens = [0]
        for n in frame_lens:
            cu_seqlens.append(cu_seqlens[-1] + n)
        if pixel_values.shape[0] != cu_seqlens[-1]:
            raise ValueError(f"pixel_values has {pixel_values.shape[0]} patches, grid_thw says {cu_seqlens[-1]}")

        x = self.patch_embed(pixel_values.to(device=device, dtype=dtype))
        x = self.post_conv_norm(x)
        pos, cos, sin = self._geometry(grids, dtype, device)
        return VisionEncoding(self, x + pos, cos, sin, cu_seqlens)

    def _geometry(self, grids: list[tuple[int, int, int]], dtype: torch.dtype,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Position embeddings and rotary cos/sin of these grids' patches, the last call's kept:
        a phone agent sends the same screen size every step, and the bicubic resampling of the
        table alone took 2.6 ms of the 72 ms tower on an H200."""
        key = (tuple(grids), dtype, device)
        if self._last_geometry is not None and self._last_geometry[0] == key:
            return self._last_geometry[1]
        # dropped first: the memory plan measured the largest image's with no other held
        self._last_geometry = None
        rows_cols = self._patch_rows_cols(grids, device)
        pos = self._position_embedding(rows_cols, grids).to(dtype)
        freqs = rows_cols.float().unsqueeze(-1) * self.inv_freq                 # N, 2, D/4
        angles = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)                  # N, D/2
        geometry = (pos, angles.cos(), angles.sin())
        self._last_geometry = (key, geometry)
        return geometry

    def block_flops(self, frame_lens: list[int]) -> float:
        """One block's FLOPs (2 a multiply-add) over frames of these patch counts: its linear
        layers, plus full attention inside each frame."""
        h = self.hidden
        macs_per_patch = 4 * h * h + 3 * h * self.out_hidden      # qkv + proj, gated MLP
        return 2.0 * macs_per_patch * sum(frame_lens) + 4.0 * h * sum(n * n for n in frame_lens)

    def finish_flops(self, num_patches: int) -> float:
        """The FLOPs after the last block: the downsample of each merge window and the patch
        merger (AutoGLM-Phone-9B: 0.79 of a block, 1.31 TFLOP on a phone screenshot)."""
        out, windows = self.out_hidden, num_patches // self.merge ** 2
        macs_per_window = self.merge ** 2 * self.hidden * out + out * out \
            + 3 * out * self.merger_inner
        return 2.0 * macs_per_window * windows

    def _finish(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        x = self.post_norm(x, residual)[0] if residual is not None else self.post_norm(x)
        x = self.downsample(x.reshape(-1, self.merge ** 2 * self.hidden))      # 4 adjacent rows = one window
        return self.merger(x)

    # ---- checkpoint loading ----
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors in; returns the names of our parameters that were set."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self._last_geometry = None      # computed from the position table being replaced

        def put(name: str, tensor: torch.Tensor, rows: slice | None = None) -> None:
            p = params[name]
            dst = p.data if rows is None else p.data[rows]
            if dst.shape != tensor.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(dst.shape)}")
            dst.copy_(tensor.to(dst.dtype))
            loaded.add(name)

        for ckpt_name, tensor in weights:
            name = ckpt_name
            for prefix in ("model.visual.", "visual."):
                if name.startswith(prefix):
                    name = name[len(prefix):]
                    break
            else:
                if name.startswith(("model.", "lm_head.")):
                    continue   # language model or head: not ours
            with torch.no_grad():
                self._load_one(name, tensor, put)
        return loaded

    def _shard(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a checkpoint tensor of a sharded tower: its heads of q, k and
        v and the matching columns of the output projection, its rows of gate and up and
        columns of down."""
        if self.tp == 1:
            return t
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            part = t.shape[0] // 3 // self.tp
            return t.view(3, -1, *t.shape[1:]).narrow(1, self.rank * part, part).reshape(
                3 * part, *t.shape[1:])
        if name.endswith(("gate_proj.weight", "up_proj.weight")):
            part = t.shape[0] // self.tp
            return t.narrow(0, self.rank * part, part)
        if name.endswith(("attn.proj.weight", "down_proj.weight")):
            part = t.shape[1] // self.tp
            return t.narrow(1, self.rank * part, part)
        return t

    def _load_one(self, name: str, t: torch.Tensor, put) -> None:
        t = self._shard(name, t)
        simple = {
            "patch_embed.proj.bias": "patch_embed.bias",
            "post_conv_layernorm.weight": "post_conv_norm.weight",
            "embeddings.position_embedding.weight": "pos_embed",
            "post_layernorm.weight": "post_norm.weight",
            "downsample.bias": "downsample.bias",
            "merger.proj.weight": "merger.proj.weight",
            "merger.post_projection_norm.weight": "merger.norm.weight",
            "merger.post_projection_norm.bias": "merger.norm.bias",
            "merger.down_proj.weight": "merger.mlp.down.weight",
        }
        if name in simple:
            return put(simple[name], t)
        if name == "patch_embed.proj.weight":                  # [D, C, T, P, P] -> [D, C*T*P*P]
            return put("patch_embed.weight", t.reshape(t.shape[0], -1))
        if name == "downsample.weight":                        # [O, D, m, m] -> [O, (m, m, D)]
            return put("downsample.weight", t.permute(0, 2, 3, 1).reshape(t.shape[0], -1))
        if name in ("merger.gate_proj.weight", "merger.up_proj.weight"):
            inner = t.shape[0]
            rows = slice(0, inner) if "gate" in name else slice(inner, 2 * inner)
            return put("merger.mlp.gate_up.weight", t, rows)
        if name.startswith("blocks."):
            _, idx, rest = name.split(".", 2)
            pre = f"blocks.{idx}."
            if rest in ("norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight"):
                return put(pre + rest, t)
            if rest == "mlp.down_proj.weight":
                return put(pre + "mlp.down.weight", t)
            if rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
                inner = t.shape[0]
                rows = slice(0, inner) if "gate" in rest else slice(inner, 2 * inner)
                return put(pre + "mlp.gate_up.weight", t, rows)
        raise KeyError(f"unexpected vision weight {name!r}")
