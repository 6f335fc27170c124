"""The engine core: scheduler + KV cache + model runner, stepping on token ids only.

It knows nothing about text: detokenization and stop strings live in the output processor, which
aborts a request here when its text hits a stop string. So this loop can run on its own thread
(or process) while tokenization and detokenization happen elsewhere.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from autoglm_serve.engine.core.cpu_threads import cpu_threads
from autoglm_serve.engine.core.fault_isolation import FaultIsolation, is_fatal, is_out_of_memory
from autoglm_serve.engine.core.kv_cache import KVCacheManager
from autoglm_serve.engine.core.pending_grammars import PendingGrammars
from autoglm_serve.engine.core.prompt_logprobs import land_prompt_logprobs
from autoglm_serve.engine.core.memory_plan import size_kv_cache
from autoglm_serve.engine.core.model_setup import LoadedModel, load_model
from autoglm_serve.engine.core.request import Request, RequestStatus
from autoglm_serve.engine.core.runner import InFlightStep, ModelRunner
from autoglm_serve.engine.core.scheduler import Scheduler
from autoglm_serve.engine.core.warm_up import warm_up
from autoglm_serve.engine.settings import EngineSettings
from autoglm_serve.engine import launch_sampler
from autoglm_serve.engine.step_trace import StepRecord
from autoglm_serve.engine.core.sampler import SamplerOutput, make_generator
from autoglm_serve.models.layers.attention import AttentionBackend
from autoglm_serve.outputs import RequestError

logger = logging.getLogger(__name__)


@dataclass
class TokenLogprobs:
    sampled_logprob: float
    sampled_rank: int
    top: list[tuple[int, float]]   # (token id, logprob), most likely first


@dataclass(slots=True)
class CoreOutput:
    request_id: str
    new_token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None       # "stop" | "length" | "abort" | None
    stop_reason: int | None = None  # the token id that stopped it
    # What the core learnt about the request, for its metrics; the first two only on the
    # request's first output (the front-end may hold a copy of the Request, not the core's).
    num_cached_tokens: int | None = None
    first_scheduled_time: float | None = None
    num_preemptions: int = 0
    error: RequestError | None = None   # with finish_reason "error": why it was failed
    prompt_logprobs: list[TokenLogprobs] | None = None   # on the first output, when asked

    def __reduce__(self):
        # a tuple, not the instance dict: several times cheaper to pickle, and a server core
        # process sends one of these per running request per step
        return CoreOutput, (self.request_id, self.new_token_ids, self.logprobs,
                            self.finish_reason, self.stop_reason, self.num_cached_tokens,
                            self.first_scheduled_time, self.num_preemptions, self.error,
                            self.prompt_logprobs)


def select_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "triton":
        from autoglm_serve.models.layers.triton_attention import TritonAttentionBackend
        return TritonAttentionBackend()
    from autoglm_serve.models.layers.torch_attention import TorchAttentionBackend
    return TorchAttentionBackend()


class EngineCore:
    def __init__(self, settings: EngineSettings, loaded: LoadedModel | None = None):
        config = self.config = settings.config
        self.settings = settings
        self.device = config.resolve_device()
        self.workers = None     # ranks 1..N-1 under tensor parallelism (engine/parallel/)
        self.launch_sampler = None
        if config.tensor_parallel_size > 1:
            if loaded is not None:
                raise ValueError("a loaded model cannot be shared by a tensor-parallel engine")
            from autoglm_serve.engine.parallel.workers import TensorParallelWorkers
            self.workers = TensorParallelWorkers(settings, self.device)
            self.device = self.workers.device
        try:
            self._start(settings, loaded)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, settings: EngineSettings, loaded: LoadedModel | None) -> None:
        config = self.config
        self.cpu_threads = cpu_threads(self.device)
        self.async_scheduling = config.resolve_async_scheduling(self.device)
        if self.workers is not None:
            self.loaded = self.workers.load_model(settings)
        else:
            self.loaded = loaded or load_model(settings, self.device)
        self.max_model_len = settings.max_model_len
        self.max_num_batched_tokens = settings.max_num_batched_tokens
        self.vocab_size = settings.vocab_size
        self.runner = self._make_runner()
        if self.device.type == "cuda":
            from autoglm_serve.kernels import compile_watch
            compile_watch.watch(False)
            self.runner.check_kernels()
        self.cache = size_kv_cache(config, self.runner, self.device, self.max_model_len,
                                   self.loaded)
        if self.workers is not None:    # every rank's cache holds as many blocks
            self.cache.num_blocks = self.workers.agree_min(self.cache.num_blocks)
            self.runner.workers = self.workers
            self.runner.layout = self.workers.layout
            if config.mm_encoder_tp_mode == "weights":
                # the sharded tower runs on every rank at once: images are encoded inside
                # the step, not ahead of it on rank 0
                self.runner.images = None
        self.runner.allocate_kv_cache(self.cache.num_blocks)
        self.kv = KVCacheManager(self.cache.num_blocks, config.block_size,
                                 config.enable_prefix_caching)
        self.runner.block_table = self.kv.block_table
        images = self.runner.images
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, self.max_num_batched_tokens,
                                   config.enable_chunked_prefill, self.max_model_len,
                                   images.ready if images is not None else None,
                                   config.decode_step_tokens)
        self._inflight: InFlightStep | None = None
        self.last_step: StepRecord | None = None     # what the last step did (step_trace.py)
        # where slow launches spend the core thread (AUTOGLM_SLOW_LAUNCH_MS, with a trace)
        self.launch_sampler = launch_sampler.from_env() if config.step_trace_path else None
        self.isolation = FaultIsolation(self.max_num_batched_tokens, self.runner.release_memory)
        self._failed: list[CoreOutput] = []     # requests failed outside a step's outputs
        self.requests: dict[str, Request] = {}
        self.grammars = PendingGrammars(self._grammar_backend)
        self.num_prompt_tokens_total = 0
        self.num_generation_tokens_total = 0
        if self.device.type == "cuda":
            capture = self.runner.wants_cuda_graphs(config)
            if self.workers is not None:
                capture = bool(self.workers.agree_min(int(capture)))
            if capture:
                self.runner.capture_cuda_graphs(self.runner.wants_prompt_graphs(config))
            warm_up(self)
            compile_watch.watch()

    def _make_runner(self) -> ModelRunner:
        backend = select_backend(self.config.attention_backend, self.device)
        return ModelRunner(self.loaded.model, backend, self.device, self.loaded.dtype,
                           self.config.block_size, self.max_model_len, self.config.max_num_seqs,
                           self.max_num_batched_tokens, self.vocab_size,
                           self.config.resolve_kv_cache_dtype(self.loaded.dtype))

    def shutdown(self) -> None:
        """Stops the tensor-parallel workers and the launch sampler's thread, if any."""
        if self.launch_sampler is not None:
            self.launch_sampler.close()
            self.launch_sampler = None
        if self.workers is not None:
            self.workers.close()

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """A request the core cannot take (its seed does not seed) is failed alone; its error
        comes out of the next step."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        try:
            if request.sampling_params.prompt_logprobs is not None and self.workers is not None:
                # computed on rank 0 alone, where the LM head's gather needs every rank
                raise ValueError("prompt logprobs (echo) are not supported with tensor "
                                 "parallelism yet")
            if request.seed is not None and request.generator is None:
                # made here, on the logits' device: the front-end may have no access to it
                request.generator = make_generator(request.seed, self.device)
            compiling = request.sampling_params.structured is not None \
                and request.grammar is None and not self.grammars.add(request)
        except Exception as exc:
            if is_fatal(exc):
                raise
            logger.error("request %s cannot be added: %s: %s", request.request_id,
                         type(exc).__name__, exc)
            self._failed.append(CoreOutput(request.request_id, [], None, "error", error=RequestError(
                f"the engine could not take this request ({type(exc).__name__}: {exc})")))
            return
        self.requests[request.request_id] = request
        if request.sampling_params.prompt_logprobs is not None:
            self.runner.prompt_logprob_ids.add(request.request_id)
        if not compiling:       # else it joins the scheduler once its grammar is compiled
            self.scheduler.add(request)
        self.num_prompt_tokens_total += request.num_prompt_tokens

    def _grammar_backend(self):
        """The grammar backend over this model's vocabulary (on the compile thread)."""
        from autoglm_serve.engine.frontend.frontend import load_engine_tokenizer
        from autoglm_serve.structured.backend import XGrammarBackend
        return XGrammarBackend(load_engine_tokenizer(self.settings), self.vocab_size, ())

    def _schedule_compiled(self) -> None:
        for req, error in self.grammars.ready():
            if error is None:
                self.scheduler.add(req)
                continue
            logger.error("request %s: its grammar did not compile: %s: %s", req.request_id,
                         type(error).__name__, error)
            self.requests.pop(req.request_id, None)
            self.runner.prompt_logprob_ids.discard(req.request_id)
            self._failed.append(CoreOutput(req.request_id, [], None, "error", error=RequestError(
                f"its structured output did not compile ({type(error).__name__}: {error})")))

    def abort(self, request_ids) -> list[str]:
        aborted = []
        for rid in request_ids:
            req = self.requests.pop(rid, None)
            if req is not None:
                self.runner.prompt_logprob_ids.discard(rid)
                if not self.grammars.discard(rid):    # not in the scheduler while compiling
                    self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
                self._drop_orphaned_encoding(req)
                aborted.append(rid)
        return aborted

    def _drop_orphaned_encoding(self, gone: Request) -> None:
        """Frees the part-run encoding of an image that only this finished request needed:
        its states (~80 MB for a screenshot) would otherwise stay until the encoder begins
        another image, which may be never on an idle server."""
        images = self.runner.images
        if images is None or images.in_progress is None:
            return
        content_hash = images.in_progress
        if not any(item.content_hash == content_hash for item in gone.mm_items):
            return
        if any(item.content_hash == content_hash
               for req in self.requests.values() for item in req.mm_items):
            return
        images.reset()

    def has_unfinished(self) -> bool:
        return (self.scheduler.has_unfinished() or self._inflight is not None
                or bool(self._failed) or bool(self.grammars))

    # ---- the step -------------------------------------------------------------------------
    def step(self) -> list[CoreOutput]:
        """One step (engine/core/fault_isolation.py: after a failed step, its requests one at a
        time), and the requests that failed since the last."""
        if self.cpu_threads is not None:
            self.cpu_threads.adjust()
        if self.grammars:
            if not (self.scheduler.has_unfinished() or self._inflight is not None):
                self.grammars.wait(0.005)   # only compiles to wait for: do not spin
            self._schedule_compiled()
        self.last_step = None
        outputs = self._isolated_step() if self.isolation.isolating else self._batched_step()
        if self._failed:
            outputs, self._failed = self._failed + outputs, []
        return outputs

    def _fail(self, req: Request, error: RequestError) -> None:
        self.scheduler.finish(req, RequestStatus.FINISHED_ERROR)
        self.runner.prompt_logprob_ids.discard(req.request_id)
        self.requests.pop(req.request_id, None)
        self._drop_orphaned_encoding(req)
        self._failed.append(CoreOutput(req.request_id, [], None, "error", error=error))

    def _isolated_step(self) -> list[CoreOutput]:
        """The first suspect alone, completed at once (nothing else in flight)."""
        outputs = self._complete(self._inflight) if self._inflight is not None else []
        self._inflight = None
        req = self.isolation.next_suspect()
        if req is None:
            return outputs
        sched = self.scheduler.schedule_alone(req, self.isolation.chunk)
        if sched.is_empty:      # nothing to run alone (its blocks do not fit): not guilty
            self.isolation.suspect_passed()
            return outputs
        try:
            launched = self.runner.launch(sched.scheduled)
        except Exception as exc:
            error = self.isolation.suspect_failed(exc, sched.num_batched_tokens)
            if error is not None:
                self._fail(req, error)
            return outputs
        self.scheduler.update_after_launch(sched.scheduled)
        self.isolation.suspect_passed()
        return outputs + self._complete(launched)

    def _batched_step(self) -> list[CoreOutput]:
        """Launches the next batch, then completes the one launched before it.

        With async scheduling the host schedules and prepares step N+1 while the device still
        runs step N; a token sampled by N reaches N+1's inputs on the device, and the counts
        that penalties read (engine/core/token_counts.py). The price: a request that stops
        (EOS, stop token, abort) computes one token too many, discarded."""
        t0 = time.perf_counter()
        budget = self.scheduler.step_budget()
        encoded = self._encode_images(budget)
        t1 = time.perf_counter()
        sched = self.scheduler.schedule(budget - encoded)
        t2, cpu2 = time.perf_counter(), time.thread_time()
        launched = None
        sampler = self.launch_sampler if not sched.is_empty else None
        if sampler is not None:
            sampler.begin()
        if not sched.is_empty:
            try:
                launched = self.runner.launch(sched.scheduled)
            except Exception as exc:    # nothing of it was recorded: its requests run again
                requests = [s.request for s in sched.scheduled]
                error = self.isolation.step_failed(requests, exc, sched.num_batched_tokens)
                if error is not None:
                    self._fail(requests[0], error)
            else:
                self.scheduler.update_after_launch(sched.scheduled)
                self.isolation.steps_succeeded()
        t3, launch_cpu = time.perf_counter(), time.thread_time() - cpu2
        launch_stacks = sampler.end() if sampler is not None else None
        outputs = self._complete(self._inflight) if self._inflight is not None else []
        t4 = time.perf_counter()
        self._inflight = launched
        synced = launched is not None and (launched.needs_sync or not self.async_scheduling)
        if synced:
            outputs += self._complete(launched)
            self._inflight = None
        self.last_step = StepRecord(sched, encoded, t1 - t0, t2 - t1, t3 - t2, launch_cpu,
                                    t4 - t3, time.perf_counter() - t4 if synced else None,
                                    launch_stacks)
        return outputs

    def _encode_images(self, step_budget: int) -> int:
        """Vision-tower blocks for the image the first held prompt needs, within what the
        running requests leave of the step's budget (engine/core/image_encoder.py); returns
        the budget used. The encoder runs one image at a time, so an image that fails to
        encode (out of memory once more after the caches were released) fails its request
        alone."""
        images = self.runner.images
        if images is None:
            return 0
        todo = self.scheduler.image_to_encode(images.in_progress)
        if todo is None:        # the common step: skip pricing what the running requests owe
            return 0
        budget = step_budget - self.scheduler.tokens_owed_by_running()
        if budget <= 0:
            return 0
        req, item = todo
        try:
            return min(self._encode(item, budget), budget)
        except Exception as exc:
            images.reset()
            error = self.isolation.step_failed([req], exc, 0)   # raises when fatal
            self._fail(req, error)
            return 0

    def _encode(self, item, budget: int) -> int:
        try:
            return self.runner.images.encode(item, budget)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            self.runner.images.reset()
            self.runner.release_memory()
            return self.runner.images.encode(item, budget)

    def _complete(self, step: InFlightStep) -> list[CoreOutput]:
        result = step.result()
        if step.prompt_logprobs:
            land_prompt_logprobs(step.prompt_logprobs, TokenLogprobs)
        logprobs = _split_logprobs(result.sampler_output, result.requests)
        outputs = []
        for i, (req, token) in enumerate(zip(result.requests, result.sampled)):
            if req.status.finished:
                req.num_inflight -= 1
                continue      # stopped or aborted while this step was in flight: discard
            req.land_token(token)
            self.kv.cache_computed_blocks(req)
            finish, stop_token = self._check_stop(req, token)
            if finish is not None:
                # safe while a later step still writes this request's KV: the blocks' next
                # owner is scheduled after it, and device work runs in launch order
                self.scheduler.finish(req, finish)
                self.requests.pop(req.request_id, None)
            first = len(req.output_token_ids) == 1
            if first:
                self.runner.prompt_logprob_ids.discard(req.request_id)
            outputs.append(CoreOutput(req.request_id, [token],
                                      [logprobs[i]] if logprobs is not None else None,
                                      finish.value if finish is not None else None, stop_token,
                                      req.num_cached_tokens if first else None,
                                      req.first_scheduled_time if first else None,
                                      req.num_preemptions,
                                      prompt_logprobs=req.prompt_logprobs if first else None))
        self.num_generation_tokens_total += len(outputs)
        return outputs

    def _check_stop(self, req: Request, token: int):
        n = len(req.output_token_ids)
        if n >= req.sampling_params.min_tokens and token in req.stop_ids:
            return RequestStatus.FINISHED_STOPPED, token
        if n >= req.max_tokens or len(req.all_token_ids) >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH, None
        return None, None

    # ---- stats ----------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)


def _split_logprobs(out: SamplerOutput | None, requests: list[Request]):
    if out is None or out.logprobs is None:
        return None
    lp = out.logprobs
    sampled = lp.sampled_logprobs.tolist()
    ranks = lp.sampled_ranks.tolist()
    top_ids = lp.top_token_ids.tolist()
    top_lps = lp.top_logprobs.tolist()
    result = []
    for i, req in enumerate(requests):
        k = req.sampling_params.logprobs
        if k is None:
            result.append(None)
            continue
        result.append(TokenLogprobs(sampled[i], ranks[i], list(zip(top_ids[i][:k], top_lps[i][:k]))))
    return result
