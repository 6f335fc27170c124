"""Tensor parallelism: one engine core (scheduler, KV-cache manager, sampler) driving N ranks,
rank 0 in the core's process and the others in worker processes, in lockstep."""
