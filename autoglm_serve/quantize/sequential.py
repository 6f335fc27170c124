"""Calibration one decoder layer at a time, as GPTQ and AWQ need it.

The inputs of the first decoder layer are captured by running the model up to it (embedding,
and for a vision model the vision tower and the M-RoPE positions); then each layer observes its
Linears on every sample, is quantized, and its quantized outputs become the next layer's inputs,
so later layers are calibrated on what they will really see. Memory: one layer's statistics and
the hidden states of the calibration set.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from autoglm_serve.quantize.calibration import CalibrationSample


class _ReachedFirstLayer(Exception):
    pass


@dataclass
class LayerCall:
    args: tuple
    kwargs: dict[str, Any]


def decoder_layers(model: torch.nn.Module, skip_prefixes: tuple[str, ...] = ("model.visual.",)
                   ) -> tuple[str, torch.nn.ModuleList]:
    """The language model's stack of decoder layers (`model.layers`, or
    `model.language_model.layers` for GLM-4.1V); the vision tower's blocks are not it."""
    for name, module in model.named_modules():
        if (isinstance(module, torch.nn.ModuleList) and name.endswith("layers")
                and not name.startswith(skip_prefixes)):
            return name, module
    raise ValueError(f"{type(model).__name__}: no decoder layer stack found")


@torch.no_grad()
def capture_first_layer_inputs(model: torch.nn.Module, first_layer: torch.nn.Module,
                               samples: list[CalibrationSample]) -> list[LayerCall]:
    calls: list[LayerCall] = []

    def grab(_module, args, kwargs):
        calls.append(LayerCall(args, kwargs))
        raise _ReachedFirstLayer

    handle = first_layer.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        for sample in samples:
            try:
                model(**sample.model_inputs(), use_cache=False)
            except _ReachedFirstLayer:
                pass
    finally:
        handle.remove()
    return calls


def _run(layer: torch.nn.Module, call: LayerCall) -> torch.Tensor:
    out = layer(*call.args, **call.kwargs)
    return out[0] if isinstance(out, tuple) else out


def _with_hidden(call: LayerCall, hidden: torch.Tensor) -> LayerCall:
    if call.args:
        return LayerCall((hidden, *call.args[1:]), call.kwargs)
    return LayerCall((), {**call.kwargs, "hidden_states": hidden})


@torch.no_grad()
def calibrate_layer_by_layer(
    model: torch.nn.Module,
    samples: list[CalibrationSample],
    quantize_layer: Callable[[str, torch.nn.Module, Callable[[], None]], None],
    desc: str = "calibrating",
) -> None:
    """For each decoder layer: `quantize_layer(prefix, layer, run_layer)`, where `run_layer()`
    runs the layer on every calibration input (the callee hooks what it observes around it and
    then replaces the weights); then the layer's new outputs feed the next one."""
    prefix, layers = decoder_layers(model)
    calls = capture_first_layer_inputs(model, layers[0], samples)
    for index, layer in enumerate(tqdm(layers, desc=desc, unit="layer")):
        def run_layer(layer=layer) -> None:
            for call in calls:
                _run(layer, call)
        quantize_layer(f"{prefix}.{index}", layer, run_layer)
        calls = [_with_hidden(call, _run(layer, call)) for call in calls]
