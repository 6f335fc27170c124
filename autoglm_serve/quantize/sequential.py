"""Calibration one decoder layer at a time, as GPTQ and AWQ need it.

The inputs of the first decoder layer are captured by running the model up to it (embedding,
and for a vision model the vision tower and the M-RoPE positions); then each layer observes its
Linears on every sample, is quantized, and its quantized outputs become the next layer's inputs,
so later layers are calibrated on what they will really see. Within a layer GPTQ goes the same
way stage by stage (`input_stages`: q/k/v, then o, then gate/up, then down), each run ended once
its stage has been seen. Memory: one layer's statistics and the hidden states of the calibration
set.
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


class LayerObserved(Exception):
    """Raised by a hook once a calibration run has seen what it needs of a layer call: the rest
    of that call is skipped."""


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
    quantize_layer: Callable[[str, torch.nn.Module, Callable[..., None]], None],
    desc: str = "calibrating",
) -> None:
    """For each decoder layer: `quantize_layer(prefix, layer, run_layer)`, where `run_layer()`
    runs the layer on every calibration input (`run_layer(limit=n)` on the first n; a hook may
    end a call early with LayerObserved) and the callee hooks what it observes around it and
    then replaces the weights; then the layer's new outputs feed the next one."""
    prefix, layers = decoder_layers(model)
    calls = capture_first_layer_inputs(model, layers[0], samples)
    for index, layer in enumerate(tqdm(layers, desc=desc, unit="layer")):
        def run_layer(layer=layer, limit: int | None = None) -> None:
            for call in calls[:limit]:
                try:
                    _run(layer, call)
                except LayerObserved:
                    pass
        quantize_layer(f"{prefix}.{index}", layer, run_layer)
        calls = [_with_hidden(call, _run(layer, call)) for call in calls]


def input_stages(linears: dict[str, torch.nn.Linear], run_layer: Callable[..., None]
                 ) -> list[list[str]]:
    """`linears` (a layer's, by name) grouped by the input tensor they share (q/k/v, gate/up), in
    the order the layer calls them, seen on the first calibration call. The tensors are held,
    not their addresses, which a freed tensor hands on."""
    first_inputs: dict[str, torch.Tensor] = {}

    def remember(name: str):
        def hook(_module, args) -> None:    # returns None: the call's inputs go on unchanged
            first_inputs.setdefault(name, args[0])
        return hook
    handles = [m.register_forward_pre_hook(remember(name)) for name, m in linears.items()]
    try:
        run_layer(limit=1)
    finally:
        for h in handles:
            h.remove()
    stages: list[list[str]] = []
    for name in first_inputs:               # insertion order: the order of the first calls
        if stages and first_inputs[stages[-1][0]] is first_inputs[name]:
            stages[-1].append(name)
        else:
            stages.append([name])
    return stages
