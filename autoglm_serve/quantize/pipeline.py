"""Quantize a model and write the checkpoint: the one entry point the command and the tests use."""
from __future__ import annotations

from pathlib import Path

import torch
from compressed_tensors.quantization import QuantizationArgs

from autoglm_serve.engine.core.cpu_threads import size_cpu_threads
from autoglm_serve.quantize.awq import InputSampler, balance_groups, search_and_apply_scales
from autoglm_serve.quantize.calibration import calibration_samples
from autoglm_serve.quantize.checkpoint_writer import write_checkpoint
from autoglm_serve.quantize.gptq import (DEFAULT_DAMP, DESCENT_PASSES, HessianObserver,
                                         gptq_quantize)
from autoglm_serve.quantize.methods import (CALIBRATED_METHODS, DEFAULT_NUM_SAMPLES, FP8_METHODS,
                                            GPTQ_METHODS, Method)
from autoglm_serve.quantize.rtn import QuantizedWeight, rtn_quantize
from autoglm_serve.quantize.schemes import (fitting_group_size, ignored_modules, int8_linears,
                                            int8_target_patterns, quantization_config,
                                            target_linears)
from autoglm_serve.quantize.sequential import LayerObserved, calibrate_layer_by_layer, input_stages
from autoglm_serve.quantize.source_model import SourceModel, load_source_model


_AWQ_ROWS = 4096   # input rows per balance group kept for the AWQ search, over all samples


def write_quantized_checkpoint(
    model: str | Path | None | SourceModel,
    out_dir: str | Path,
    method: Method = "gptq",
    group_size: int | None = None,
    act_order: bool = False,
    symmetric: bool = True,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    max_tokens: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    int8_targets: list[str] = (),
) -> Path:
    """Quantize `model` (a path as `serve` takes it, None for the embedded default, or a loaded
    SourceModel, which is consumed) and write a compressed-tensors checkpoint to `out_dir`.
    The algorithms run in float32 on `device`; the checkpoint is written in `dtype`.
    `int8_targets` (int4 methods): Linears kept at 8 bits (schemes.int8_target_patterns)."""
    if int8_targets and method in FP8_METHODS:
        raise ValueError("--int8-targets is for the int4 methods (rtn, gptq, awq)")
    # the engine's thread pool (engine/core/cpu_threads.py): also what makes a calibration's
    # float32 sums, and so its checkpoint, the same in every entry point on one machine
    size_cpu_threads(torch.device(device))
    source = model if isinstance(model, SourceModel) else load_source_model(model)
    hf = source.model.to(device=device, dtype=torch.float32)
    ignore = ignored_modules(hf)
    targets = target_linears(hf, ignore)
    if method not in FP8_METHODS:
        group_size = fitting_group_size(targets, group_size)
    patterns = int8_target_patterns(list(int8_targets))
    eight_bit = int8_linears(targets, patterns)
    config = quantization_config(method, ignore, group_size or 0, act_order, symmetric, patterns)
    args = config.config_groups["group_0"].weights
    args_by_name = {name: config.config_groups["group_1"].weights for name in eight_bit}
    samples = (_samples(source, num_samples, max_tokens, device)
               if method in CALIBRATED_METHODS else [])
    quantized = quantize_linears(hf, targets, method, args, dtype, samples, act_order,
                                 args_by_name=args_by_name)
    hf.to("cpu")
    return write_checkpoint(hf, out_dir, config, {k: _to_cpu(v) for k, v in quantized.items()},
                            dtype, source.files_dir, None if source.files_dir else source.tokenizer)


def quantize_linears(hf: torch.nn.Module, targets: dict[str, torch.nn.Linear], method: Method,
                     args, dtype: torch.dtype, samples: list, act_order: bool = False,
                     damp: float = DEFAULT_DAMP, refit: bool = True,
                     descent_passes: int = DESCENT_PASSES,
                     args_by_name: dict[str, QuantizationArgs] | None = None
                     ) -> dict[str, QuantizedWeight]:
    """Each of `targets`' quantized weight (scales in `dtype`). GPTQ and AWQ calibrate on
    `samples` one decoder layer at a time and replace those layers' weights in `hf` as they go
    (AWQ also folds its scales into the norms and Linears before them); the rest, and every
    Linear of rtn and fp8, are rounded to nearest and left as they are in `hf`. gptq-fp8 always
    goes in act-order: its one scale a row is fixed before the first column, so the order costs
    nothing and stores nothing. `args_by_name`: the Linears quantized otherwise than `args`
    (kept at 8 bits)."""
    quantized: dict[str, QuantizedWeight] = {}
    args_by_name = args_by_name or {}
    act_order = act_order or method in FP8_METHODS

    if method in CALIBRATED_METHODS:
        def layer_linears(prefix: str, layer: torch.nn.Module) -> dict[str, torch.nn.Linear]:
            return {f"{prefix}.{n}": m for n, m in layer.named_modules() if f"{prefix}.{n}" in targets}

        def gptq_layer(prefix: str, layer: torch.nn.Module, run_layer) -> None:
            # true sequential: each stage (the Linears that share one input) is observed with
            # the stages before it already quantized, so it compensates their rounding too
            linears = layer_linears(prefix, layer)
            for stage in input_stages(linears, run_layer):
                observer = HessianObserver(linears[stage[0]])   # one X^T X serves the stage
                # the stage's last Linear seen: the rest of the layer call is not needed
                done = linears[stage[-1]].register_forward_hook(_stage_observed)
                try:
                    run_layer()
                finally:
                    observer.remove()
                    done.remove()
                for name in stage:
                    q = gptq_quantize(linears[name].weight, observer.hessian, observer.tokens,
                                      args_by_name.get(name, args), dtype, act_order, damp,
                                      refit=refit,
                                      descent_passes=descent_passes)
                    linears[name].weight.data.copy_(q.weight)
                    quantized[name] = q

        def awq_layer(prefix: str, layer: torch.nn.Module, run_layer) -> None:
            groups = balance_groups(layer)
            samplers = [InputSampler(g.linears[0], max(16, _AWQ_ROWS // len(samples))) for g in groups]
            run_layer()
            args_of = {id(m): args_by_name.get(f"{prefix}.{n}", args) for n, m in layer.named_modules()}
            for group, sampler in zip(groups, samplers):
                search_and_apply_scales(group, sampler.inputs(),
                                        [args_of[id(lin)] for lin in group.linears], dtype)
            for name, linear in layer_linears(prefix, layer).items():
                quantized[name] = rtn_quantize(linear.weight, args_by_name.get(name, args), dtype)
                linear.weight.data.copy_(quantized[name].weight)

        layer_fn = gptq_layer if method in GPTQ_METHODS else awq_layer
        calibrate_layer_by_layer(hf, samples, layer_fn, desc=f"{method} calibration")

    for name, linear in targets.items():   # rtn, fp8, and any Linear outside the decoder layers
        if name not in quantized:
            quantized[name] = rtn_quantize(linear.weight, args_by_name.get(name, args), dtype)
    return quantized


def _stage_observed(*_):
    raise LayerObserved


def _samples(source: SourceModel, num_samples: int, max_tokens: int, device: str):
    image_token_id = getattr(source.model.config, "image_token_id", None) if source.is_vision else None
    samples = calibration_samples(source.tokenizer, num_samples, max_tokens, image_dir=source.files_dir,
                                  image_token_id=image_token_id)
    return [s.to(device) for s in samples]


def _to_cpu(q: QuantizedWeight) -> QuantizedWeight:
    return QuantizedWeight(q.weight.cpu(), q.scale.cpu(), q.zero_point.cpu())
