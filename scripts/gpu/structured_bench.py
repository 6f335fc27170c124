"""Decode tok/s with half the rows under a JSON schema vs none, in one call (issue 20).

    python scripts/gpu/structured_bench.py            # H200: AutoGLM-Phone-9B arch, dummy bf16
    python scripts/gpu/structured_bench.py --smoke    # CPU: tiny random GLM-4.1V, a few tokens

Two runs of the same workload, after a warm-up: STREAMS requests of INPUT random prompt tokens,
OUTPUT new tokens each (ignore_eos, so every row decodes OUTPUT tokens: a constrained row whose
grammar completes runs on unconstrained), submitted together; first with no constraint, then
with every second request under a nested JSON schema (one compiled grammar, a matcher per row).
tok/s = STREAMS x OUTPUT / wall. Prints one JSON line per run and the ratio; the issue's bar
is constrained >= 0.90 x unconstrained.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT]

SCHEMA = {"type": "object", "properties": {
    "steps": {"type": "array", "items": {"type": "object", "properties": {
        "action": {"enum": ["tap", "swipe", "type", "back"]},
        "x": {"type": "integer", "minimum": 0, "maximum": 999},
        "y": {"type": "integer", "minimum": 0, "maximum": 999},
        "note": {"type": "string"}}, "required": ["action", "x", "y", "note"]}}},
    "required": ["steps"]}


def build_llm(args):
    from autoglm_serve import LLM
    if args.smoke:
        sys.path.insert(0, ROOT)
        from tests.glm4v_fixtures import make_tiny_glm4v
        model = make_tiny_glm4v(tempfile.mkdtemp(prefix="tiny-glm4v-"))
        return LLM(str(model), device="cpu", max_model_len=512, kv_cache_memory_gib=0.25,
                   max_num_seqs=args.streams)
    return LLM(args.model, load_format="dummy", dtype="bfloat16", max_model_len=2048,
               max_num_seqs=max(64, args.streams), gpu_memory_utilization=0.85)


def run(llm, args, constrained: bool, seed: int) -> dict:
    from autoglm_serve import SamplingParams
    from autoglm_serve.structured import StructuredSpec
    rng = random.Random(seed)
    spec = StructuredSpec.json_schema(SCHEMA)
    prompts = [[rng.randrange(200) for _ in range(args.input_len)] for _ in range(args.streams)]
    params = [SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True,
                             structured=spec if constrained and i % 2 == 0 else None)
              for i in range(args.streams)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"run": "half_json_schema" if constrained else "unconstrained",
            "streams": args.streams, "output_len": args.output_len, "tokens": tokens,
            "wall_s": round(wall, 3), "tok_per_s": round(tokens / wall, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="autoglm-phone-9b")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=512)
    args = ap.parse_args(argv)
    if args.smoke:
        args.streams, args.output_len = min(args.streams, 8), min(args.output_len, 16)
    import torch
    torch.set_num_threads(1 if args.smoke else torch.get_num_threads())
    llm = build_llm(args)
    warm = argparse.Namespace(**{**vars(args), "output_len": 8})
    run(llm, warm, True, 0)       # compiles the grammar, warms graphs and allocator
    results = [run(llm, args, False, 1), run(llm, args, True, 1)]
    for r in results:
        print(json.dumps(r))
    ratio = results[1]["tok_per_s"] / results[0]["tok_per_s"]
    print(json.dumps({"constrained_over_unconstrained": round(ratio, 3),
                      "meets_0_90": ratio >= 0.90}))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "structured_bench.json"), "w") as f:
            json.dump({"results": results, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
