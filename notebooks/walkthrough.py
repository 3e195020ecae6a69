# %% [markdown]
# # Self-attention step by step, in NumPy
#
# The worked example of `numpy-attn walkthrough`, computed cell by cell with `numpy_attn`'s
# operations: each prints the tables the command prints on its NumPy side, the same numbers
# (`numpy-attn walkthrough --no-torch` prints them alone). The command also runs every step in
# `torch_attn` and shows the two side by side; here each step is the few lines of NumPy it takes.
#
# The inputs are the command's: `OPTIONS` below takes its options, so that
# `OPTIONS = ["A dog ran", "--dim", "6"]` gives the tables of `numpy-attn walkthrough "A dog ran" --dim 6`.

# %%
import argparse

import numpy as np
from IPython.display import HTML, display

from attn_cli import plots, term, walk_steps, walkthrough
from numpy_attn.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from numpy_attn.embedding import embedding_forward
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.multi_head import merge_heads, multi_head_attention_forward, split_heads
from numpy_attn.positional import sinusoidal_encoding
from numpy_attn.softmax import softmax_backward, softmax_forward

OPTIONS = []                 # numpy-attn walkthrough's options: TEXT, --dim, --d-out, --heads, --seed, ...

parser = argparse.ArgumentParser(prog="numpy-attn walkthrough")
walkthrough.add_arguments(parser)
args = parser.parse_args(OPTIONS)
inputs = walk_steps.prepare(args)                 # the text tokenized, the embeddings and weights drawn
labels = inputs.labels                            # each token's row and column label
precision = walkthrough.DECIMALS[inputs.dtype.name] if args.precision is None else args.precision
T, C, d, nh = len(inputs.ids), inputs.C, inputs.d_out, inputs.num_heads
hs = C // nh
chan = [f"c{j}" for j in range(C)]
dcol = [f"d{j}" for j in range(d)]
print(f"{inputs.text!r}: {T} GPT-2 tokens, C = {C}, d = {d}, {nh} heads, {inputs.dtype.name}, seed {inputs.seed}")


def table(title, a, rows, cols, sums=False, index=(), undoes=None):
    """Print ``a[index]`` as the command prints a table: title and shape, then rows and columns
    labelled (``sums``: each row's sum last; ``undoes``: the forward line a gradient undoes)."""
    shape = f"{a.shape}" if index == () else f"{a.shape}, showing [{', '.join(map(str, np.atleast_1d(index)))}]"
    print(f"\n  {title}  shape {shape}")
    if undoes is not None:
        print(f"    undoes {undoes}")
    a = a[index]
    for line in term.table_lines(a[:, None] if a.ndim == 1 else a, rows, cols, precision, sums):
        print("    " + line)


def heatmap(title, panels, signed=False):
    """Draw each panel [(panel title, values (T, T))] as an SVG heatmap whose cells show their
    value on hover (no network needed): weights on a 0..1 scale, or with ``signed`` gradients red
    for positive and blue for negative; a causal step's cells above the diagonal are masked (grey).
    Every heatmap of this notebook is drawn here."""
    for name, w in panels:
        masked = None if signed or "causal" not in title else np.triu(np.ones(w.shape, dtype=bool), 1)
        svg = plots.heatmap_svg(w, labels, labels, title=f"{title} {name}".strip(), signed=signed,
                                masked=masked, precision=precision)
        display(HTML(svg))           # HTML rather than SVG: some front ends show SVG as an image, without its tooltips


# %% [markdown]
# ## Step 1. GPT-2 tokenization
#
# The text becomes GPT-2's token ids (tiktoken's encoding; NumPy has no tokenizer, and neither has torch).

# %%
ids = inputs.ids                                  # (T,) int64
print("token strings:", " ".join(repr(s) for s in inputs.pieces))
table("ids = encode(text)", ids, labels, ["id"])

# %% [markdown]
# ## Step 2. Embedding lookup
#
# Each id picks its row of the embedding table `wte` (V, C), drawn from N(0, 1) as
# `torch.nn.Embedding` draws it.

# %%
x, _ = embedding_forward(ids, inputs.wte)         # (T,) -> (T, C)
table(f"x = wte[ids], C = {C} (--dim)", x, labels, chan)

# %% [markdown]
# ## Step 3. Sinusoidal positions, added
#
# `PE[t, 2i] = sin(t / 10000^(2i/C))`, `PE[t, 2i+1] = cos(t / 10000^(2i/C))`: without them
# attention sees a bag of tokens, the same output for any order of the same words.

# %%
if inputs.positional:
    pe = sinusoidal_encoding(T, C, dtype=inputs.dtype)   # (T, C)
    table("PE, sin on even channels, cos on odd", pe, labels, chan)
    x = x + pe                                    # (T, C)
    table("x = x + PE, the input of attention", x, labels, chan)
else:
    print("positions left out (--no-positional): attention's input is the embeddings alone")

# %% [markdown]
# ## Step 4. Weight-free self-attention
#
# Every token's input is its own query, key and value: no weights, no scaling. `linear_forward`
# with `w = x.T` and no bias is the plain matmul `x @ x.T`.

# %%
scores, _ = linear_forward(x, x.T)                # (T, C) @ (C, T) -> (T, T)
weights, _ = softmax_forward(scores)              # (T, T), rows sum to one
context, _ = linear_forward(weights, x)           # (T, T) @ (T, C) -> (T, C)
table("scores = x @ x.T", scores, labels, labels)
table("weights = softmax(scores), each row sums to 1", weights, labels, labels, sums=True)
table("context = weights @ x", context, labels, chan)
heatmap("Step 4: weight-free self-attention weights", [("", weights)])

# %% [markdown]
# ## Step 5. Trainable projections
#
# Queries, keys and values are three projections of `x` to `d` dimensions; the scores are scaled
# by `1 / sqrt(d)`. The caches are kept: step 9 runs this step backward.

# %%
q, q_cache = linear_forward(x, inputs.w_query)    # (T, C) -> (T, d)
k, k_cache = linear_forward(x, inputs.w_key)      # (T, C) -> (T, d)
v, v_cache = linear_forward(x, inputs.w_value)    # (T, C) -> (T, d)
scores, scores_cache = linear_forward(q, k.T)     # (T, d) @ (d, T) -> (T, T)
scaled = scores * inputs.scale                    # (T, T), scale = 1 / sqrt(d)
weights, softmax_cache = softmax_forward(scaled)  # (T, T)
context, context_cache = linear_forward(weights, v)   # (T, T) @ (T, d) -> (T, d)
table("queries = x @ W_query", q, labels, dcol)
table("keys = x @ W_key", k, labels, dcol)
table("values = x @ W_value", v, labels, dcol)
table("scores = queries @ keys.T", scores, labels, labels)
table(f"scaled scores = scores / sqrt({d})", scaled, labels, labels)
table("weights = softmax(scaled scores)", weights, labels, labels, sums=True)
table("context = weights @ values", context, labels, dcol)
heatmap(f"Step 5: weights of softmax(q k^T / sqrt({d}))", [("", weights)])
# The same in one call; its cache serves step 9's one-call backward.
sdpa, sdpa_cache = scaled_dot_product_attention_forward(q, k, v)
print(f"\nscaled_dot_product_attention(q, k, v): max |difference| = {np.abs(sdpa - context).max():.2e}")

# %% [markdown]
# ## Step 6. The causal mask
#
# A decoder predicts token t+1 from tokens 0..t, so query t must not see the keys after t:
# their scores become `-inf`, which the softmax turns into weight 0.

# %%
mask = np.tri(T, dtype=np.bool_)                  # (T, T), True on and below the diagonal
masked = np.where(mask, scaled, -np.inf).astype(scaled.dtype)   # (T, T)
causal_weights, _ = softmax_forward(masked)       # (T, T)
causal_context, _ = linear_forward(causal_weights, v)   # (T, d)
table("mask: 1 where query (row) may attend to key (column)", mask, labels, labels)
table("masked scores: -inf above the diagonal", masked, labels, labels)
table("causal weights = softmax(masked scores)", causal_weights, labels, labels, sums=True)
table("causal context = causal weights @ values", causal_context, labels, dcol)
table("what the mask changed: causal context - step 5 context", causal_context - context, labels, dcol)
heatmap("Step 6: causal attention weights (grey: masked)", [("", causal_weights)])

# %% [markdown]
# ## Step 7. Multi-head attention, causal
#
# The width C is split into `nh` heads of `hs = C / nh` channels; each head attends on its own,
# then the heads are merged back and projected. The parameters are
# `init_multi_head_params(C, rng)`'s: q, k, v, o, each `w` (C, C) and `b` (C,).

# %%
params = inputs.params
xb = x[None]                                      # (T, C) -> (1, T, C), a batch of one
Q, _ = linear_forward(xb, **params["q"])          # (1, T, C)
K, _ = linear_forward(xb, **params["k"])          # (1, T, C)
V, _ = linear_forward(xb, **params["v"])          # (1, T, C)
heads, heads_cache = scaled_dot_product_attention_forward(
    split_heads(Q, nh), split_heads(K, nh), split_heads(V, nh), is_causal=True)   # (1, nh, T, hs)
head_weights = heads_cache.weights.astype(heads.dtype, copy=False)           # (1, nh, T, T)
merged = merge_heads(heads)                       # (1, nh, T, hs) -> (1, T, C)
out, _ = linear_forward(merged, **params["o"])    # (1, T, C)
head_cols = [f"h{h}.{j}" if hs > 1 else f"h{h}" for h in range(nh) for j in range(hs)]
table("Q = x @ Wq + bq, columns grouped by head", Q, labels, head_cols, index=0)
table("K = x @ Wk + bk", K, labels, head_cols, index=0)
table("V = x @ Wv + bv", V, labels, head_cols, index=0)
for h in range(nh):
    table(f"head {h}: causal weights = softmax(Q_h K_h^T / sqrt({hs}))", head_weights, labels, labels, sums=True,
          index=(0, h))
table(f"merge_heads(head outputs): (1, {nh}, {T}, {hs}) -> (1, {T}, {C})", merged, labels, head_cols, index=0)
table("out = merged @ Wo + bo", out, labels, chan, index=0)
heatmap(f"Step 7: the causal weights of each of the {nh} heads (grey: masked)",
        [(f"head {h}", head_weights[0, h]) for h in range(nh)])
one_call, _ = multi_head_attention_forward(xb, params, nh, is_causal=True)
print(f"\nmulti_head_attention_forward in one call: max |difference| = {np.abs(one_call - out).max():.2e}")

# %% [markdown]
# ## Step 8. Decoding with a KV cache, one token at a time
#
# Under the causal mask a token's key and value never change once computed, so a cache keeps
# them: step t projects only the new token, appends its key and value, and its query attends over
# the t + 1 cached keys (`is_causal="bottom_right"`: the new query is the last row). Its output
# is row t of step 7's.

# %%
cache = init_kv_cache(1, 1, nh, T, hs, dtype=inputs.dtype)   # k, v (1, 1, nh, T, hs) of zeros
width = max(len(label) for label in labels)
print(f"    {'t':>2}  {'token':<{width}}  length  bytes  max |out_t - row t of step 7's out|")
for t in range(T):
    out_t, _ = multi_head_attention_forward(xb[:, t:t + 1], params, nh, is_causal="bottom_right",
                                            kv_cache=cache.layer(0))   # (1, 1, C) -> (1, 1, C)
    diff = np.abs(out_t[0, 0].astype(np.float64) - out[0, t].astype(np.float64)).max()
    print(f"    {t:>2}  {labels[t]:<{width}}  {cache.length:>6}  {cache.length * cache.bytes_per_token:>5}  {diff:.2e}")

# %% [markdown]
# ## Step 9. The backward of step 5
#
# A loss to send back: `L = sum(context * G)`, with `G` a fixed (T, d) matrix drawn from N(0, 1),
# so that `dL/dcontext = G`: the upstream gradient the layers above would send down. Each line
# undoes one line of step 5, from its last to its first, with step 5's caches.

# %%
G = inputs.upstream                               # (T, d) = dL/dcontext
loss = (context * G).sum()
table("G = dL/dcontext, the upstream gradient", G, labels, dcol)
print(f"\nL = sum(context * G) = {term.fmt(loss, precision)}")
# Undoes context = weights @ values: dweights = G values^T, dv = weights^T G.
dweights, dv = linear_backward(G, context_cache)      # (T, T), {"w": (T, d)}
# Undoes weights = softmax(scaled): weights * (dweights - rowsum(weights * dweights)).
dscores = softmax_backward(dweights, softmax_cache)   # (T, T)
# Undoes scaled = scores * scale, then scores = q @ k^T: dq = dscores k, d(k^T) = q^T dscores.
dq, dk_t = linear_backward(dscores * inputs.scale, scores_cache)   # (T, d), {"w": (d, T)}
dk = dk_t["w"].T                                  # (d, T) -> (T, d)
context_undone = "context = weights @ values"
table("dweights = G @ values.T", dweights, labels, labels, undoes=context_undone)
table("dv = weights.T @ G", dv["w"], labels, dcol, undoes=context_undone)
table("dscores = weights * (dweights - rowsum(weights * dweights))", dscores, labels, labels, sums=True,
      undoes="weights = softmax(scaled scores)")
heatmap("Step 9: dscores = dL/d(scaled scores),\nthrough the softmax's Jacobian", [("", dscores)], signed=True)
scores_undone = f"scaled scores = queries @ keys.T / sqrt({d})"
table(f"dq = dscores @ keys / sqrt({d})", dq, labels, dcol, undoes=scores_undone)
table(f"dk = dscores.T @ queries / sqrt({d})", dk, labels, dcol, undoes=scores_undone)
# Undoes q, k, v = x @ W: dW = x^T dq (and dk, dv).
for name, grad, projection in (("query", dq, q_cache), ("key", dk, k_cache), ("value", dv["w"], v_cache)):
    table(f"dW_{name} = x.T @ d{name[0]}", linear_backward(grad, projection)[1]["w"], chan, dcol,
          undoes=f"{name[0]} = x @ W_{name}")
one_call = scaled_dot_product_attention_backward(G, sdpa_cache)      # (dq, dk, dv) in one call
largest = max(np.abs(a - b).max() for a, b in zip(one_call, (dq, dk, dv["w"]), strict=True))
print(f"\nscaled_dot_product_attention_backward(G, cache): max |difference| = {largest:.2e}")
