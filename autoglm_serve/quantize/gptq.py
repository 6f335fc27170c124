"""GPTQ (Frantar et al., 2022): quantize a Linear's columns one at a time and spread each one's
rounding error over the columns not yet quantized, weighted by the inverse Hessian of the layer's
inputs (H = 2 X^T X over the calibration tokens), so the layer's outputs move as little as
possible. With act-order the columns go in order of decreasing H diagonal (most active inputs
first) while each keeps the scale of its contiguous group ("static groups", no g_idx).

The damping is each input's own diagonal times `damp`, not a share of H's mean diagonal: a few
inputs carry the attention sink's huge activations (SmolLM2: 5 of 576 hold half of q_proj's
trace), so a share of the mean is large beside the quiet inputs and tiny beside the loud ones.
Scaling each diagonal shrinks the correlations between inputs, which a calibration set of a
few thousand tokens estimates poorly, by the same factor everywhere (SmolLM2, group 32 with
zero points, act-order, 48 samples, perplexity on prose: 1% of the mean +12.2%, 10% of each
diagonal +2.2% to +4.1% by the thread count; round-to-nearest +9.7%).

Once the codes are chosen, each row's group scales are solved again for them against the same
output error (`refit_group_scales`): GPTQ fixes a group's scale before it rounds and compensates,
and the codes it ends with want other scales. SmolLM2, perplexity against GPTQ's own scales, on
held-out texts of 7,700 and 9,700 tokens: 1 thread +9.5% / +9.7% -> +7.9% / +8.2% (48 samples),
+9.6% / +9.0% -> +8.6% / +9.0% (40), +10.3% / +9.7% -> +9.2% / +8.3% (64); 2 threads +9.6% /
+9.2% -> +8.4% / +8.4%. The 351-token prose moves either way (+3.5% -> +2.8%, 2 threads +3.1%
-> +3.6%). GPTQ run again on the refit scales, then refit, lost what the refit won.

Between the two, the codes go through a few passes of coordinate descent (`descend_codes`) on
the output error with DESCENT_DAMP times H's diagonal added: GPTQ decides each column once,
while the columns after it are unrounded, and trusts every correlation that a few thousand
calibration tokens estimate; the added diagonal (each input's own scale, which other texts share
more than the correlations) keeps the descent from fitting the calibration set alone. SmolLM2,
48 samples, 1 thread, on four held-out texts (GPL-3, a 40,000-character slice of Python's pydoc
topics, Apache-2.0, another slice; 2,200-9,700 tokens each): GPTQ and refit +8.0% / +9.2% /
+14.2% / +8.6%; with 3 passes at 5x the diagonal +6.0% / +6.5% / +9.9% / +5.0%, at 3x +6.2% /
+6.9% / +9.8% / +5.5%; GPTQ's own damping raised to 1.0 instead +8.1% / +8.0% / +12.6% / +6.9%;
descent at GPTQ's 0.1 of the diagonal +8.6% / +9.7% on the first two, worse. 40 samples: +8.3%
/ +9.2% / +13.0% / +8.0% -> +6.5% / +6.1% / +9.6% / +4.7%. The 351-token prose goes the other
way, +4.0% -> +5.0% (40 samples +2.4% -> +4.2%).

FP8 weights (`quantize --method gptq-fp8`) go through the same three on float8_e4m3's grid, with
one scale a row fixed from the whole weight before the first column (so act-order costs
nothing). SmolLM2, weights alone (activations unquantized), on the four texts above: rounding to
nearest (`--method fp8`, scales searched) +3.2% / +1.1% / +3.4% / +1.1%; GPTQ, descent and refit
+1.4% / +0.6% / +1.9% / +0.6%; without the descent +1.2% / +1.0% / +3.2% / +0.8%.
"""
from __future__ import annotations

import torch
from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy, QuantizationType
from compressed_tensors.quantization.utils.helpers import calculate_range

from autoglm_serve.quantize.rtn import QuantizedWeight, weight_qparams

DEFAULT_DAMP = 0.1   # of each input's H diagonal (the module's docstring says why)
# coordinate descent after GPTQ: its passes, and the share of H's diagonal added to its objective
# (the module's docstring says why)
DESCENT_PASSES = 3
DESCENT_DAMP = 5.0


class HessianObserver:
    """Accumulates X^T X of a Linear's inputs through a forward pre-hook."""

    def __init__(self, linear: torch.nn.Linear):
        self.hessian = torch.zeros(linear.in_features, linear.in_features, dtype=torch.float32,
                                   device=linear.weight.device)
        self.tokens = 0
        self._handle = linear.register_forward_pre_hook(self._observe)

    def _observe(self, _module, args) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        self.hessian.addmm_(x.t(), x)
        self.tokens += x.shape[0]

    def remove(self) -> None:
        self._handle.remove()


def _inverse_hessian_cholesky(hessian: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of H^-1, with `damp` times each input's own diagonal added to it
    (more where H is still not positive definite)."""
    diagonal = torch.diag(hessian.diagonal())
    for attempt in range(6):
        try:
            lower = torch.linalg.cholesky(hessian + damp * (10 ** attempt) * diagonal)
            return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)
        except torch.linalg.LinAlgError:
            continue
    raise torch.linalg.LinAlgError("the calibration Hessian stays singular after damping")


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, tokens: int, args: QuantizationArgs,
                  scale_dtype: torch.dtype, act_order: bool = False, damp: float = DEFAULT_DAMP,
                  block_size: int = 128, clip_search: bool = True, refit: bool = True,
                  descent_passes: int = DESCENT_PASSES, descent_damp: float = DESCENT_DAMP
                  ) -> QuantizedWeight:
    """`args`: int weights by group, symmetric or with zero points. `damp`: the fraction of each
    input's H diagonal added to it (SmolLM2 perplexity against 22.09 unquantized, group 32
    act-order with zero points, 16 samples: 0.01 24.12, 0.1 23.14, 0.3 23.17, 1.0 23.16).
    `clip_search`: each group's range shrunk where that lowers its own squared error.
    `descent_passes`, `descent_damp`: then `descend_codes` on the output error with
    `descent_damp` times H's diagonal added (0 passes: GPTQ's codes as they come).
    `refit`: the group scales solved again for the codes chosen (`refit_group_scales`)."""
    W = weight.detach().float().clone()
    rows, cols = W.shape
    gs = args.group_size
    H = hessian.float() * (2.0 / max(tokens, 1))
    dead = H.diagonal() == 0          # inputs never active: any value works, use 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    # the refit's target: W is compensated in place below; H is only ever rebound, not written
    target, target_hessian = W.clone(), H
    grid = _Grid(args, W.device)

    # static scales (act-order, or one scale a row: FP8's): from the whole weight, before any
    # column moves; otherwise each group's as GPTQ reaches it
    per_channel = args.strategy == QuantizationStrategy.CHANNEL
    static = act_order or per_channel
    gs = cols if per_channel else gs
    scale = torch.zeros(rows, cols // gs, dtype=scale_dtype, device=W.device)
    zero = torch.zeros(rows, cols // gs, dtype=torch.int8, device=W.device)
    if static:
        scale, zero = weight_qparams(W, args, scale_dtype, clip_search)
        zero = zero.to(torch.int8)
    if act_order:
        perm = torch.argsort(H.diagonal(), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
    else:
        perm = torch.arange(cols, device=W.device)
    Hinv = _inverse_hessian_cholesky(H, damp)

    if not static:
        block_size = max(block_size // gs, 1) * gs   # whole groups per block
    Q = torch.zeros_like(W)
    for b0 in range(0, cols, block_size):
        b1 = min(b0 + block_size, cols)
        W1 = W[:, b0:b1].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            if not static and col % gs == 0:
                # the group's scale from its current, error-compensated weights
                s_, z_ = weight_qparams(W1[:, i:i + gs], _per_row(args), scale_dtype, clip_search)
                scale[:, col // gs], zero[:, col // gs] = s_[:, 0], z_[:, 0].to(torch.int8)
            g = int(perm[col]) // gs
            s, z = scale[:, g].float(), zero[:, g].float()
            w = W1[:, i]
            q = grid.nearest(w, s, z)
            Q[:, col] = q
            err = (w - q) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) * Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        W[:, b1:] -= Err1 @ Hinv[b0:b1, b1:]
    if act_order:
        Q = Q[:, torch.argsort(perm)]
    if descent_passes:
        objective = target_hessian + descent_damp * torch.diag(target_hessian.diagonal())
        Q = descend_codes(target, Q, scale, zero, objective, args, descent_passes, perm)
    if refit:
        Q, scale = refit_group_scales(target, Q, scale, target_hessian, args)
    return QuantizedWeight(Q, scale, zero)


def descend_codes(weight: torch.Tensor, quantized: torch.Tensor, scale: torch.Tensor,
                  zero: torch.Tensor, hessian: torch.Tensor, args: QuantizationArgs, passes: int,
                  order: torch.Tensor, block_size: int = 128) -> torch.Tensor:
    """`passes` of cyclic coordinate descent on the codes of `quantized` (scales and zero points
    held) for the least (W - Q) H (W - Q)^T: each weight in turn, in `order` (a permutation of
    the columns), takes the code nearest to its exact minimizer with every other weight held,
    q + (R H)_j / H_jj for the residual R = W - Q. No step raises the objective, so it ends at
    or below GPTQ's codes, which fixed each column once while the columns after it were not yet
    rounded. A block of columns updates R H for itself as it goes and for all columns once at
    its end, by a matmul; a pass costs what GPTQ's column pass does, rows x inputs^2
    multiply-adds."""
    rows, cols = weight.shape
    gs = cols // scale.shape[1]
    grid = _Grid(args, weight.device)
    W, Q, H = weight[:, order], quantized[:, order].clone(), hessian[order][:, order]
    s = scale.float().repeat_interleave(gs, 1)[:, order]
    z = zero.float().repeat_interleave(gs, 1)[:, order]
    gradient = (W - Q) @ H            # (R H): the objective's slope in each weight, halved
    diagonal = H.diagonal()
    for _ in range(passes):
        for b0 in range(0, cols, block_size):
            b1 = min(b0 + block_size, cols)
            block = gradient[:, b0:b1].clone()
            moved = torch.zeros(rows, b1 - b0, dtype=W.dtype, device=W.device)
            for i, col in enumerate(range(b0, b1)):
                want = Q[:, col] + block[:, i] / diagonal[col]
                q = grid.nearest(want, s[:, col], z[:, col])
                moved[:, i] = q - Q[:, col]
                Q[:, col] = q
                block -= moved[:, i:i + 1] * H[col, b0:b1].unsqueeze(0)
            gradient -= moved @ H[b0:b1]     # all columns (the block's own: as block has)
    return Q[:, torch.argsort(order)]


class _Grid:
    """The values `args` can store, per weight given its scale and zero point: integers
    (clamp(round(w / s) + z) - z) s, or float8's (a symmetric float has no zero point:
    cast(clamp(w / s)) s, as compressed-tensors' fake_quantize). GPTQ's column pass, the descent
    and the refit round alike, so each starts on the codes the one before stored."""

    def __init__(self, args: QuantizationArgs, device: torch.device):
        self.qmin, self.qmax = (float(v) for v in calculate_range(args, device))
        self.float_dtype = args.pytorch_dtype() if args.type == QuantizationType.FLOAT else None

    def nearest(self, w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
        return self.codes(w / scale, zero) * scale

    def exact(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes less their zero points recovered from a float division (q s / s)."""
        return codes.to(self.float_dtype).float() if self.float_dtype is not None else codes.round()

    def codes(self, scaled: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
        """The stored value nearest each of `scaled` (w / s), less its zero point."""
        if self.float_dtype is not None:
            return scaled.clamp(self.qmin, self.qmax).to(self.float_dtype).float()
        return torch.clamp(torch.round(scaled) + zero, self.qmin, self.qmax) - zero


def refit_group_scales(weight: torch.Tensor, quantized: torch.Tensor, scale: torch.Tensor,
                       hessian: torch.Tensor, args: QuantizationArgs,
                       rows_per_solve: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """With GPTQ's integer codes held, each row's group scales solved together for the least
    output error (w - A s)^T H (w - A s), A holding the codes group by group: a G x G linear
    system a row. GPTQ picks its scales before it rounds and compensates; for the codes it ends
    with, other scales do better (SmolLM2, group 32, layers 0 and 15: 2-12% less squared error
    in their outputs on held-out text). Zero points stay: the codes are the same integers. A
    scale that comes out non-positive or not finite keeps its old value. `rows_per_solve`: rows
    solved at once (by default as many as keep the [rows, cols, groups] product under 2^25
    elements: a 9B MLP's 13,696 inputs in groups of 32 make it 5.9 M a row). It costs about
    what GPTQ's column pass costs, rows x inputs^2 multiply-adds (that MLP's down_proj: ~9
    minutes on one CPU thread)."""
    rows, cols = weight.shape
    groups = scale.shape[1]
    gs = cols // groups
    rows_per_solve = rows_per_solve or max(1, 2 ** 25 // (cols * groups))
    old = scale.float()
    codes = _Grid(args, weight.device).exact(quantized / old.repeat_interleave(gs, 1))
    h_blocks = hessian.reshape(groups, gs, groups, gs)
    hw = weight @ hessian
    new = torch.empty_like(old)
    for r0 in range(0, rows, rows_per_solve):
        c = codes[r0:r0 + rows_per_solve].reshape(-1, groups, gs)
        hc = torch.einsum("gahb,rhb->rgah", h_blocks, c)
        system = torch.einsum("rga,rgah->rgh", c, hc)
        rhs = (c * hw[r0:r0 + rows_per_solve].reshape(-1, groups, gs)).sum(-1)
        # a group whose codes are all 0 has an empty row: a little ridge keeps it solvable
        diag = system.diagonal(dim1=1, dim2=2)
        ridge = diag * 1e-6 + diag.mean(-1, keepdim=True).clamp(min=1e-30) * 1e-9
        new[r0:r0 + rows_per_solve] = torch.linalg.solve(
            system + torch.diag_embed(ridge), rhs.unsqueeze(-1)).squeeze(-1)
    new = torch.where(torch.isfinite(new) & (new > 0), new, old).to(scale.dtype)
    return codes * new.float().repeat_interleave(gs, 1), new


def _per_row(args: QuantizationArgs) -> QuantizationArgs:
    """The same int args, one scale per row of the block given (one group's columns)."""
    return args.model_copy(update={"strategy": "channel", "group_size": None})
