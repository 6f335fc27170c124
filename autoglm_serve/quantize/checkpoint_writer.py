"""Write a quantized transformers model as a compressed-tensors checkpoint.

The layout is compressed-tensors' own: its `apply_quantization_config` attaches the scheme and
the qparams to each Linear, its compressors pack them (`weight_packed` int32 + `weight_scale` +
`weight_shape` for int4, `weight` float8_e4m3fn + `weight_scale` for fp8), transformers'
`save_pretrained` writes the safetensors, and `ModelCompressor.update_config` puts
`quantization_config` into config.json: the checkpoint vLLM and transformers load as they load
one from llm-compressor.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.format import infer_model_format
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

from autoglm_serve.quantize.rtn import QuantizedWeight
from autoglm_serve.quantize.schemes import target_linears

# Files of the source checkpoint that are not weights or config.json: tokenizer, chat template,
# generation config, the processor of a vision model. Copied as they are.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
_NOT_COPIED = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}


def write_checkpoint(model: torch.nn.Module, out_dir: str | Path, config: QuantizationConfig,
                     quantized: dict[str, QuantizedWeight], dtype: torch.dtype,
                     source_dir: Path | None = None, tokenizer=None) -> Path:
    """`quantized` maps every Linear `config` targets to its quantized weight. Modifies `model`
    (its Linears end up compressed). `source_dir`'s tokenizer/processor files are copied; a
    model without one (GGUF) passes its `tokenizer`, which is saved."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(dtype)
    targets = target_linears(model, config.ignore)
    missing = sorted(set(targets) - set(quantized))
    if missing:
        raise ValueError(f"no quantized weight for {len(missing)} Linear(s), e.g. {missing[:3]}")

    apply_quantization_config(model, config, show_progress=False)
    with torch.no_grad():
        for name, module in targets.items():
            q = quantized[name]
            module.weight.copy_(q.weight.to(dtype))
            module.weight_scale.copy_(q.scale.to(module.weight_scale.dtype))
            module.weight_zero_point.copy_(q.zero_point.to(module.weight_zero_point.dtype))

    config = config.model_copy(deep=True)
    config.format = infer_model_format(model)
    compressor = ModelCompressor(quantization_config=config)
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(str(out_dir))

    if source_dir is not None:
        for path in sorted(Path(source_dir).iterdir()):
            if path.is_file() and path.name not in _NOT_COPIED and not path.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(path, out_dir / path.name)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
