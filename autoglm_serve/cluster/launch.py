"""`autoglm-serve cluster`: start (or join) a Ray cluster, deploy the ingress and the engine
replicas with Ray Serve, serve until SIGTERM or Ctrl-C, then take the application down."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from autoglm_serve.cluster.args import (ROUTERS, autoscaling, autoscaling_config,
                                        check_cluster_args, num_replicas)
from autoglm_serve.server.args import engine_config_from_args, settings_from_args
from autoglm_serve.server.launch import _configure_logging, bind_socket

logger = logging.getLogger("autoglm_serve.cluster")
APP_NAME = "autoglm"


def replica_resources(args: argparse.Namespace, cluster_gpus: float) -> dict:
    gpus = args.replica_gpus
    if gpus is None:
        gpus = args.tensor_parallel_size if cluster_gpus > 0 and args.device != "cpu" else 0
    options = {"num_cpus": args.replica_cpus, "num_gpus": gpus}
    if not gpus:   # torch on CPU uses the CPUs Ray reserved, not every core of the node
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, int(args.replica_cpus)))
        options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": threads}}
    return options


def build_application(args: argparse.Namespace, cluster_gpus: float):
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from autoglm_serve.cluster.ingress import Ingress
    from autoglm_serve.cluster.replica import EngineReplica

    # Serve logs every call of every replica unless told not to: a cost under load
    logs = {"enable_access_log": args.enable_access_log}
    router_kwargs = ({"imbalance_threshold": args.affinity_imbalance_threshold}
                     if args.request_router == "affinity" else {})
    scale = ({"autoscaling_config": autoscaling_config(args)} if autoscaling(args)
             else {"num_replicas": num_replicas(args)})
    replicas = serve.deployment(EngineReplica, name="EngineReplica").options(
        ray_actor_options=replica_resources(args, cluster_gpus),
        max_ongoing_requests=args.max_ongoing_requests
        or args.max_num_seqs + args.max_waiting_requests,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTERS[args.request_router],
            request_router_kwargs=router_kwargs,
            request_routing_stats_period_s=args.replica_stats_period_s),
        health_check_period_s=args.health_check_period_s,
        graceful_shutdown_timeout_s=args.graceful_shutdown_timeout, logging_config=logs,
        **scale)
    ingress = serve.deployment(Ingress, name="Ingress").options(
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000, logging_config=logs)
    return ingress.bind(replicas.bind(args))


def run_cluster(args: argparse.Namespace) -> int:
    _configure_logging(args.uvicorn_log_level)
    try:
        check_cluster_args(args)
        engine_config_from_args(args)   # a bad flag fails here, not in every replica
        settings = settings_from_args(args)
        bind_socket(settings.host, settings.port).close()   # busy port: fail in a second
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import ray
    from ray import serve

    if args.address:
        ray.init(address=args.address, logging_level=logging.WARNING)
    else:
        ray.init(include_dashboard=False, logging_level=logging.WARNING)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        cluster_gpus = ray.cluster_resources().get("GPU", 0)
        logger.info("Ray cluster: %s; deploying %s", ray.cluster_resources(),
                    f"{autoscaling_config(args)}" if autoscaling(args)
                    else f"{num_replicas(args)} replicas")
        serve.run(build_application(args, cluster_gpus), name=APP_NAME, route_prefix="/",
                  blocking=False)
        host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
        logger.info("serving on http://%s:%d/v1 (router: %s)", host, settings.port,
                    args.request_router)
        while not stop.wait(1.0):
            pass
        logger.info("shutting down the cluster application")
        return 0
    except RuntimeError as exc:   # a deployment that cannot start
        print(f"error: cannot start the cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.address:
            serve.delete(APP_NAME)
        else:
            serve.shutdown()
        ray.shutdown()
