"""The engine core: the step and what it runs on (requests, KV cache, scheduler, runner, sampler,
model set-up, fault isolation, start-up memory plan)."""
