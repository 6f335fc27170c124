"""Serving benchmarks: load generator, datasets (incl. the phone-agent workload), GPU monitor,
reports and plots, offline-engine benchmark and the settings tuner.

Entry points: autoglm_serve.bench.cli.add_bench_subcommands / add_tune_subcommand.
"""
