"""``python -m benchmarks --ops decode_sliding`` and ``--ops decode_mla``: what a smaller
key/value cache costs or buys in decoding, NumPy beside the torch twin.

decode_sliding: a Gemma 2 (numpy_attn/gemma2.py, sliding and global layers alternating) with
window W decodes greedily up to a context of 4W, once with its bounded cache
(``gemma2_kv_cache``: a sliding layer keeps its last W tokens) and once with a full one
(``init_kv_cache`` without windows: every layer keeps every token). The first 3W - 1 prompt
tokens are prefilled once, untimed; a timed call copies that cache and runs W single-token steps
(the prompt's last token, then each new one), at contexts 3W to 4W - 1: tokens/s = W / median
time. Before timing, the parent process does the same (prefill, then W steps) with both caches in
both libraries, and the four token sequences must be equal; each worker's timed call must give
them again. The bytes are the cache objects' own counts after that: ``bytes_per_token`` (what one
more token adds), ``bytes_held`` (the 4W - 1 tokens seen; the last new one is never fed back) and
``nbytes`` (the allocation).

decode_mla: one attention layer, one decode step: a new token over a cache of S tokens
(prefilled, untimed; each timed call rewinds the cache to S tokens, so that every call appends
the same token to the same cache). Four layers of nh heads each: MLA absorbed
(``mla_absorbed_forward`` over a LatentCache), MLA naive over its full per-head keys and values
(``mla_forward(..., kv_cache=)``, ``init_mla_kv_cache``), and Llama attention
(``llama_attention_forward``) with grouped-query heads (GQA) and with one key/value head per query
head (MHA), of head size dv. Before timing, the parent checks each twin's step against NumPy's
and MLA absorbed against naive (``parity.TOLERANCE``, relative to the output's scale). Bytes per
token are each cache object's own, beside ``mla_cache_bytes_per_token``'s formula.

``--seq-lens`` gives the windows W of decode_sliding and the cache lengths S of decode_mla.

Timing: one worker per library (``_worker.py``), pinned to ``--threads``. Inside a worker the
cases of one size take turns, one sample each, the order reversed every other round, for
``--repeats`` rounds: a drift of the machine's speed falls on all of them alike. The report gives
the median over the rounds and the quartiles.

torch is imported inside the functions that use it, never at module level: the NumPy worker
imports this module and must never load torch.
"""

import contextlib
import copy
import textwrap
import time

import numpy as np

from benchmarks import machine, measure, parity, report
from benchmarks.decode import greedy, greedy_torch, run_results, threads_of, tree_map
from benchmarks.workers import Worker
from numpy_attn.gemma2 import Gemma2Config, gemma2_forward, gemma2_kv_cache, init_gemma2_params
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.llama import LlamaConfig, init_llama_params, llama_attention_forward
from numpy_attn.mla import (
    MLAConfig,
    init_latent_cache,
    init_mla_kv_cache,
    init_mla_params,
    mla_absorbed_forward,
    mla_cache_bytes_per_token,
    mla_forward,
)

# -- sizes -----------------------------------------------------------------------------------------

# decode_sliding: a 4-layer Gemma 2 (layers 0 and 2 sliding, 1 and 3 global); the head is its own
# matrix, not the embedding: with tied weights a random model repeats its last token forever,
# which would make the token check say little.
SLIDING = dict(full=dict(windows=[128], model=dict(vocab_size=4096, n_layer=4, n_head=4, n_kv_head=2,
                                                   n_embd=128, head_dim=32, hidden=512)),
               quick=dict(windows=[8], model=dict(vocab_size=64, n_layer=2, n_head=2, n_kv_head=1,
                                                  n_embd=16, head_dim=8, hidden=32)))
SLIDING_REPEATS = 7

# decode_mla: DeepSeek-V2-Lite's attention sizes (C 2048, 16 heads, latent 512, no query
# compression, dn 128, dr 64, dv 128); GQA with 8 key/value heads, as mla_cache_bytes_per_token.
MLA = dict(full=dict(contexts=[512, 2048], n_kv_head=8,
                     model=dict(n_embd=2048, n_head=16, q_lora_rank=None, kv_lora_rank=512,
                                qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)),
           quick=dict(contexts=[16, 32], n_kv_head=2,
                      model=dict(n_embd=32, n_head=4, q_lora_rank=None, kv_lora_rank=8,
                                 qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6)))
MLA_REPEATS = 21
MLA_VARIANTS = ("mla_absorbed", "mla_naive", "gqa", "mha")
PREFILL_CHUNK = 256          # prompt tokens per prefill forward: bounds the (T, S) score matrix


# -- decode_sliding ------------------------------------------------------------------------------

def sliding_config(window, model):
    """The Gemma 2 of window W: block_size 4W, scores scaled by 1 / sqrt(hs) as most checkpoints."""
    return Gemma2Config(block_size=4 * window, sliding_window=window, tie_weights=False,
                        query_pre_attn_scalar=float(model["head_dim"]), **model)


def sliding_inputs(config, dtype, seed):
    """(params, prompt (1, 3W)), drawn from the seed in the same order in every process."""
    rng = np.random.default_rng([seed, config.sliding_window])
    params = init_gemma2_params(config, rng, dtype)
    prompt = rng.integers(0, config.vocab_size, (1, 3 * config.sliding_window))
    return params, prompt


def sliding_caches_numpy(config, dtype):
    """{"bounded": sliding layers keep their last W tokens, "full": every layer every token}."""
    return {"bounded": gemma2_kv_cache(config, 1, dtype),
            "full": init_kv_cache(config.n_layer, 1, config.n_kv_head, config.block_size, config.hs, dtype)}


def sliding_caches_twin(config, dtype):
    """The same with torch_attn's caches."""
    import torch

    import torch_attn.gemma2 as tw
    from torch_attn.kv_cache import init_kv_cache as init_twin_cache

    dtype = getattr(torch, np.dtype(dtype).name)
    return {"bounded": tw.gemma2_kv_cache(config, 1, dtype),
            "full": init_twin_cache(config.n_layer, 1, config.n_kv_head, config.block_size, config.hs, dtype)}


def cache_bytes(cache):
    """The cache object's own counts: what one more token adds, what is held, the allocation."""
    return dict(bytes_per_token=cache.bytes_per_token, bytes_held=cache.bytes_held, nbytes=cache.nbytes)


def _sliding_generations(window, model, dtype, seed):
    """In the parent, untimed: every (impl, cache) prefilled and decoding to 4W as a timed call
    does, the tokens and the cache's bytes of each."""
    import torch

    from torch_attn.gemma2 import gemma2

    config = sliding_config(window, model)
    params, prompt = sliding_inputs(config, dtype, seed)
    tparams = tree_map(params, torch.from_numpy)
    out = {}
    for kind, cache in sliding_caches_numpy(config, dtype).items():
        prefill(gemma2_forward, params, config, prompt, cache)
        ids = greedy(gemma2_forward, params, config, prompt, window, cache)
        out["numpy", kind] = dict(tokens=ids[0, prompt.shape[1]:].tolist(), **cache_bytes(cache))
    with torch.no_grad():
        for kind, cache in sliding_caches_twin(config, dtype).items():
            prefill(gemma2, tparams, config, torch.from_numpy(prompt), cache)
            ids = greedy_torch(gemma2, tparams, config, torch.from_numpy(prompt), window, cache)
            out["twin", kind] = dict(tokens=ids[0, prompt.shape[1]:].tolist(), **cache_bytes(cache))
    return out


def prefill(forward, params, config, prompt, cache):
    """All but the last prompt token into the empty ``cache``, PREFILL_CHUNK at a time (a
    forward's (T, S) scores stay bounded); the last one is the first step of the decoding."""
    for start in range(0, prompt.shape[1] - 1, PREFILL_CHUNK):
        forward(prompt[:, start:min(start + PREFILL_CHUNK, prompt.shape[1] - 1)], params, config, kv_cache=cache)


def _sliding_time(job):
    """In a timing worker: bounded and full taking turns, per window; a row each."""
    spec, dtype = job["decode"], np.dtype(job["dtype"])
    for window in spec["windows"]:
        config = sliding_config(window, spec["model"])
        params, prompt = sliding_inputs(config, dtype, spec["seed"])
        if job["library"] == "numpy":
            impl, forward, generate, caches = "numpy", gemma2_forward, greedy, sliding_caches_numpy(config, dtype)
        else:
            import torch

            from torch_attn.gemma2 import gemma2

            impl, forward, generate, caches = "twin", gemma2, greedy_torch, sliding_caches_twin(config, dtype)
            params, prompt = tree_map((params, prompt), torch.from_numpy)
        fns = {}
        with _no_grad(impl):
            for kind, cache in caches.items():
                prefill(forward, params, config, prompt, cache)                  # 3W - 1 tokens, untimed
                fns[kind] = _decode_from(generate, forward, params, config, prompt, window, cache)
        for kind, time_s in take_turns(fns, job["repeats"], impl).items():
            with _no_grad(impl):
                tokens = np.asarray(fns[kind]())[0, prompt.shape[1]:].tolist()   # those of the timed path
            yield dict(impl=impl, window=window, cache=kind, time_s=time_s, timed_tokens=tokens)


def _decode_from(generate, forward, params, config, prompt, new_tokens, prefilled):
    """A call that decodes ``new_tokens`` greedily from a copy of the ``prefilled`` cache."""
    return lambda: generate(forward, params, config, prompt, new_tokens, copy.deepcopy(prefilled))


def run_sliding(args, argv):
    """Tokens checked in the parent, then both workers' timings: the results dict."""
    started, load = time.monotonic(), machine.LoadWatch()
    size = SLIDING["quick" if args.quick else "full"]
    windows = args.seq_lens or size["windows"]
    threads, repeats = threads_of(args), args.repeats or SLIDING_REPEATS
    checked = {}
    with _pools(threads):
        for window in windows:
            checked[window] = _sliding_generations(window, size["model"], np.dtype(args.dtype), args.seed)
            tokens = {key: r["tokens"] for key, r in checked[window].items()}
            if any(t != tokens["numpy", "bounded"] for t in tokens.values()):
                raise parity.ParityError(f"decode_sliding W={window}: the generated tokens differ, "
                                         f"nothing was timed: {tokens}")
    job = dict(device="cpu", threads=threads, dtype=args.dtype, repeats=repeats, min_time=0.0,
               decode=dict(run="decode_sliding", windows=windows, model=size["model"], seed=args.seed))
    envs, timed = _time_workers(job, len(windows) * 2 * 2, args.no_progress)
    rows = []
    for r in timed:
        W, checks = r["window"], checked[r["window"]][r["impl"], r["cache"]]
        same = r.pop("timed_tokens") == checks["tokens"]           # the timed path (prefilled) too
        rows.append(dict(r, context=4 * W, prompt=3 * W, new_tokens=W, tokens_per_s=W / r["time_s"]["median"],
                         same_tokens=same, **checks))
    config = dict(model=size["model"], windows=windows, dtype=args.dtype, threads=threads, repeats=repeats,
                  seed=args.seed, quick=args.quick)
    return run_results("decode_sliding", argv, started, load, envs, config, rows)


def _tok_s_iqr(r):
    """The tokens/s at the quartiles of the time: tokens per call over q75, over q25."""
    per_call = r["new_tokens"] if "new_tokens" in r else 1
    return f"{per_call / r['time_s']['q75']:.1f}-{per_call / r['time_s']['q25']:.1f}"


def _tok_s(r):
    return f"{r['tokens_per_s']:.1f}"


# (title, the row's key or a function of the row giving the text)
SLIDING_COLUMNS = [("impl", "impl"), ("W", "window"), ("context", "context"), ("cache", "cache"), ("tok/s", _tok_s),
                   ("IQR tok/s", _tok_s_iqr), ("bytes/token", "bytes_per_token"), ("bytes held", "bytes_held"),
                   ("nbytes", "nbytes"), ("same tokens", lambda r: "yes" if r["same_tokens"] else "NO")]


SLIDING_CAPTION = (
    "decode_sliding: greedy decoding of a Gemma 2 (V={vocab_size} n_layer={n_layer}, sliding and global layers "
    "alternating, n_head={n_head} n_kv_head={n_kv_head} n_embd={n_embd} hs={head_dim}), {dtype}: a prompt of 3W "
    "tokens (3W - 1 prefilled, untimed), then W new tokens, at contexts 3W to 4W - 1; tokens/s = W / median "
    "time; bytes: the cache object's own after the generation: per token (what one more token adds), held (the "
    "4W - 1 tokens seen; the last new one is never fed back) and allocated (nbytes)")


def sliding_table_lines(results):
    """The report: machine, then one line per library, window and cache."""
    return _table(results, SLIDING_CAPTION, SLIDING_COLUMNS, left=1)


# -- decode_mla ----------------------------------------------------------------------------------

def llama_config(config, n_kv_head, max_len):
    """Llama attention with MLA's width C and nh heads, n_kv_head key/value heads of size dv."""
    return LlamaConfig(vocab_size=1, block_size=max_len, n_layer=1, n_head=config.n_head, n_kv_head=n_kv_head,
                       n_embd=config.n_embd, head_dim=config.v_head_dim, hidden=1)


def mla_inputs(config, n_kv_head, S, dtype, seed):
    """(MLA params, {"gqa": attention params, "mha": ...}, x of the S cached tokens (1, S, C), x of
    the new one (1, 1, C)), drawn from the seed in the same order in every process."""
    rng = np.random.default_rng([seed, S])
    params = init_mla_params(config, rng, dtype)
    attn = {name: init_llama_params(llama_config(config, nkv, S + 1), rng, dtype)["blocks"]["0"]["attn"]
            for name, nkv in (("gqa", n_kv_head), ("mha", config.n_head))}
    x = rng.standard_normal((1, S + 1, config.n_embd)).astype(dtype)
    return params, attn, x[:, :S], x[:, S:]


def mla_steps_numpy(config, n_kv_head, S, dtype, seed):
    """{variant: (step, cache)}: step() decodes the new token over the S prefilled tokens."""
    params, attn, x_past, x_new = mla_inputs(config, n_kv_head, S, dtype, seed)
    latent = init_latent_cache(config, 1, S + 1, dtype)
    naive = init_mla_kv_cache(config, 1, 1, S + 1, dtype).layer(0)
    steps = {"mla_absorbed": (lambda x, pos: mla_absorbed_forward(x, params, config, latent), latent),
             "mla_naive": (lambda x, pos: mla_forward(x, params, config, kv_cache=naive)[0], naive)}
    for name, nkv in (("gqa", n_kv_head), ("mha", config.n_head)):
        lcfg = llama_config(config, nkv, S + 1)
        layer = init_kv_cache(1, 1, nkv, S + 1, lcfg.hs, dtype).layer(0)
        steps[name] = (lambda x, pos, p=attn[name], c=lcfg, layer=layer:
                       llama_attention_forward(x, p, c, pos, kv_cache=layer)[0], layer)
    return _prefilled(steps, x_past, x_new, np.arange)


def mla_steps_twin(config, n_kv_head, S, dtype, seed):
    """The same with torch_attn's MLA, attention and caches."""
    import torch

    from torch_attn.kv_cache import init_kv_cache as init_twin_cache
    from torch_attn.llama import llama_attention
    from torch_attn.mla import init_latent_cache as init_twin_latent
    from torch_attn.mla import init_mla_kv_cache as init_twin_naive
    from torch_attn.mla import mla, mla_absorbed

    params, attn, x_past, x_new = tree_map(mla_inputs(config, n_kv_head, S, dtype, seed), torch.from_numpy)
    tdtype = getattr(torch, np.dtype(dtype).name)
    latent = init_twin_latent(config, 1, S + 1, tdtype)
    naive = init_twin_naive(config, 1, 1, S + 1, tdtype).layer(0)
    steps = {"mla_absorbed": (lambda x, pos: mla_absorbed(x, params, config, latent), latent),
             "mla_naive": (lambda x, pos: mla(x, params, config, kv_cache=naive), naive)}
    for name, nkv in (("gqa", n_kv_head), ("mha", config.n_head)):
        lcfg = llama_config(config, nkv, S + 1)
        layer = init_twin_cache(1, 1, nkv, S + 1, lcfg.hs, tdtype).layer(0)
        steps[name] = (lambda x, pos, p=attn[name], c=lcfg, layer=layer:
                       llama_attention(x, p, c, pos, kv_cache=layer), layer)
    with torch.no_grad():
        return _prefilled(steps, x_past, x_new, torch.arange)


def _prefilled(steps, x_past, x_new, arange):
    """Fill each cache with the S tokens of x_past, PREFILL_CHUNK at a time; return
    {variant: (step, cache)}, step() rewinding the cache to S tokens and decoding x_new."""
    S = x_past.shape[1]
    for forward, _ in steps.values():
        for start in range(0, S, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, S)
            forward(x_past[:, start:end], arange(start, end))

    def step(forward, cache):
        _rewind(cache, S)
        return forward(x_new, arange(S, S + 1))
    return {name: (lambda forward=forward, cache=cache: step(forward, cache), cache)
            for name, (forward, cache) in steps.items()}


def _rewind(cache, length):
    """Set a cache back to ``length`` tokens: a LatentCache, or one layer of a KVCache."""
    if hasattr(cache, "index"):                    # a layer of a KVCache (NumPy's or the twin's)
        cache.cache.lengths[cache.index] = length
    else:
        cache.length = length


def mla_bytes(cache):
    """(bytes per token, bytes of the tokens held) of the cache object: a LatentCache or a
    KVCache's layer, of one sequence."""
    held = cache.held if hasattr(cache, "index") else cache.length
    return cache.bytes_per_token, cache.bytes_per_token * held


def _mla_check(config, n_kv_head, S, dtype, seed, tol):
    """In the parent, untimed: every twin step against NumPy's, and absorbed against naive: the
    {variant: bytes} of NumPy's caches (raises ParityError on a difference)."""
    import torch

    numpy_steps = mla_steps_numpy(config, n_kv_head, S, dtype, seed)
    twin_steps = mla_steps_twin(config, n_kv_head, S, dtype, seed)
    problems, figures = [], {}
    with torch.no_grad():
        for name, (step, cache) in numpy_steps.items():
            twin_step, _ = twin_steps[name]
            figures[name] = mla_bytes(cache)         # of the S prefilled; the twin's caches are laid out alike
            err = _step_err(twin_step().numpy(), step())
            if not err <= tol:
                problems.append(f"{name}: twin vs numpy, relative error {err:.2e} > {tol:.0e}")
    if "mla_naive" in numpy_steps:
        err = _step_err(numpy_steps["mla_absorbed"][0](), numpy_steps["mla_naive"][0]())
        if not err <= tol:
            problems.append(f"mla_absorbed vs mla_naive, relative error {err:.2e} > {tol:.0e}")
    if problems:
        raise parity.ParityError(f"decode_mla S={S} {np.dtype(dtype)}: nothing was timed:\n  " + "\n  ".join(problems))
    return figures


def _step_err(actual, expected):
    """max |actual - expected| / max |expected|, in float64. Not parity.rel_err's max(max |e|, 1):
    a step's output is small (weights of scale 0.02) but dense, with no entry that is zero in
    exact arithmetic, so the error is taken relative to its own scale, where parity.TOLERANCE's
    reasoning holds (float32 sums over C and S terms lose ~3 of ~7 digits at most)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(a - e)) / np.max(np.abs(e)))


def _mla_time(job):
    """In a timing worker: the variants taking turns, per context; a row each."""
    spec, dtype = job["decode"], np.dtype(job["dtype"])
    config = MLAConfig(**spec["model"])
    make, impl = (mla_steps_numpy, "numpy") if job["library"] == "numpy" else (mla_steps_twin, "twin")
    for S in spec["contexts"]:
        fns = {name: step for name, (step, _) in make(config, spec["n_kv_head"], S, dtype, spec["seed"]).items()}
        for name, time_s in take_turns(fns, job["repeats"], impl).items():
            yield dict(impl=impl, S=S, variant=name, time_s=time_s)


def run_mla(args, argv):
    """Parity in the parent, then both workers' timings: the results dict."""
    started, load = time.monotonic(), machine.LoadWatch()
    size = MLA["quick" if args.quick else "full"]
    config, dtype = MLAConfig(**size["model"]), np.dtype(args.dtype)
    contexts = args.seq_lens or size["contexts"]
    threads, repeats = threads_of(args), args.repeats or MLA_REPEATS
    tol = parity.TOLERANCE[dtype] if args.tolerance is None else args.tolerance
    formula = mla_cache_bytes_per_token(config, dtype, n_kv_head=size["n_kv_head"])
    with _pools(threads):
        figures = {S: _mla_check(config, size["n_kv_head"], S, dtype, args.seed, tol) for S in contexts}
    job = dict(device="cpu", threads=threads, dtype=args.dtype, repeats=repeats, min_time=0.0,
               decode=dict(run="decode_mla", contexts=contexts, model=size["model"], n_kv_head=size["n_kv_head"],
                           seed=args.seed))
    envs, timed = _time_workers(job, len(contexts) * len(figures[contexts[0]]) * 2, args.no_progress)
    rows = []
    for r in timed:
        per_token, held = figures[r["S"]][r["variant"]]
        rows.append(dict(r, tokens_per_s=1 / r["time_s"]["median"], bytes_per_token=per_token, cache_bytes=held,
                         formula_bytes_per_token=formula[r["variant"]]))
    order = {name: i for i, name in enumerate(MLA_VARIANTS)}
    rows.sort(key=lambda r: (r["S"], order[r["variant"]], r["impl"]))
    run_config = dict(model=size["model"], n_kv_head=size["n_kv_head"], head_size=config.v_head_dim,
                      contexts=contexts, dtype=args.dtype, threads=threads, repeats=repeats, seed=args.seed,
                      quick=args.quick, tolerance=tol)
    return run_results("decode_mla", argv, started, load, envs, run_config, rows)


MLA_COLUMNS = [("S", "S"), ("variant", "variant"), ("impl", "impl"), ("tok/s", _tok_s), ("IQR tok/s", _tok_s_iqr),
               ("bytes/token", "bytes_per_token"), ("formula", "formula_bytes_per_token"),
               ("bytes held", "cache_bytes")]


MLA_CAPTION = (
    "decode_mla: one decode step of one attention layer (a new token over a cache of S tokens), {dtype}, "
    "C={n_embd} nh={n_head}; MLA rkv={kv_lora_rank} dn={qk_nope_head_dim} dr={qk_rope_head_dim} dv={v_head_dim} "
    "q_lora_rank={q_lora_rank}; GQA {n_kv_head} and MHA {n_head} key/value heads of hs={head_size}; tokens/s = "
    "1 / median step time; bytes: NumPy's cache objects' own, per token and for the S held (formula: "
    "mla_cache_bytes_per_token)")


def mla_table_lines(results):
    """The report: machine, then one line per context, variant and library."""
    return _table(results, MLA_CAPTION, MLA_COLUMNS, left=3)


# -- shared ---------------------------------------------------------------------------------------

def _table(results, caption, columns, left):
    """The header lines, the caption (filled in from the run's config and model), and the rows
    laid out in ``columns`` (the first ``left`` flush left)."""
    c = results["config"]
    rows = [[text(r) if callable(text) else str(r[text]) for _, text in columns] for r in results["rows"]]
    return [*_header_lines(results), *textwrap.wrap(caption.format(**c, **c["model"]), 100), "",
            *report.layout([title for title, _ in columns], rows, False, left)]


def take_turns(fns, rounds, impl, warmup=1):
    """Time each of ``fns`` (name -> callable) one sample in turn, ``rounds`` times, the order
    reversed every other round: {name: measure.summarize's dict}. The twin's calls run under
    torch.no_grad(), on the intra-op threads the worker set (``--threads``)."""
    with _no_grad(impl):
        number = {name: measure.calls_per_sample(measure.warm_up(fn, warmup)) for name, fn in fns.items()}
        seconds = {name: [] for name in fns}
        order = list(fns)
        for r in range(rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                seconds[name].append(measure.sample(fns[name], number[name]))
    return {name: measure.summarize(seconds[name], number[name]) for name in fns}


def _no_grad(impl):
    if impl == "numpy":
        return contextlib.nullcontext()
    import torch

    return torch.no_grad()


WORKERS = {"decode_sliding": _sliding_time, "decode_mla": _mla_time}
RUNS = {"decode_sliding": (run_sliding, sliding_table_lines), "decode_mla": (run_mla, mla_table_lines)}


@contextlib.contextmanager
def _pools(threads):
    """Both libraries' thread pools at ``threads`` for the untimed checks in the parent, restored after."""
    import torch

    from numpy_attn._threads import limit_blas_threads

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with limit_blas_threads(threads, required=True):
            yield
    finally:
        torch.set_num_threads(old)


def _time_workers(job, steps, no_progress):
    """The NumPy worker, then the torch one: (their env records, their rows)."""
    progress = report.progress_bar(steps, no_progress)
    envs, rows = [], []
    for library in ("numpy", "torch"):
        with Worker(dict(job, library=library)) as worker:
            for record in worker.records():
                kind = record.pop("kind")
                if kind == "env":
                    envs.append(record)
                else:
                    rows.append(record)
                    progress.step(f"{job['decode']['run']} {record['impl']} "
                                  + " ".join(f"{k}={record[k]}" for k in ("window", "cache", "S", "variant")
                                             if k in record))
    return envs, rows


def _header_lines(results):
    """The machine (CPU, vector extensions, each worker's BLAS kernel and threads) and the sampling."""
    c = results["config"]
    return [*report.machine_lines(results),
            f"threads: {c['threads']} per timed process; {c['repeats']} rounds, the cases of one size taking turns "
            "in each worker, one sample each (a block of calls of at least 10 ms), after 1 warm-up call; "
            "median and IQR over the rounds",
            ""]
