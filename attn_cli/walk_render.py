"""The walkthrough's terminal output: each step's tables, NumPy beside PyTorch with their largest
difference, the worked dot products of the followed token, and a closing summary."""

import numpy as np

from attn_cli import term


def max_abs_diff(a, b):
    """Largest |a - b|, counting equal infinities (masked scores) as no difference."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:            # broadcasting would compare the wrong numbers
        raise ValueError(f"cannot compare shapes {a.shape} and {b.shape}")
    same = a == b                     # also True where both are the same infinity
    with np.errstate(invalid="ignore"):   # inf - inf, where ``same`` already answers
        diff = np.where(same, 0.0, np.abs(a - b))
    return float(diff.max()) if diff.size else 0.0


class Printer:
    """Prints steps and tables; records each table's largest difference and the weights to plot.

    Prose is wrapped to ``width``; with ``brief`` only each step's key table is printed (every
    table is still compared, and counts in the summary).
    """

    def __init__(self, inputs, results, out, style, precision, width, brief=False):
        self.inputs = inputs
        self.np = results["NumPy"]
        self.torch = results.get("PyTorch")
        self.out = out
        self.style = style
        self.precision = precision
        self.width = width
        self.brief = brief
        self.tolerance = 1e-4 if inputs.dtype == np.float32 else 1e-10
        self.diffs = []               # (step, table title, max |NumPy - PyTorch|)
        self.heatmaps = []            # (file stem, title, [(panel title, weights (T, T))])
        self.step_number = 0

    def raw(self, text=""):
        """One line as it is (tables: already laid out for the width)."""
        print(text, file=self.out)

    def line(self, text="", kind=None, indent="  ", more=4):
        """Prose: wrapped to the width, each piece styled ``kind``."""
        if not text:
            self.raw()
            return
        for piece in term.wrap(text, self.width, indent, more):
            self.raw(indent + self.style(kind, piece[len(indent):]))

    def note(self, text):
        if not self.brief:
            self.line(text, "note")

    def step(self, number, title, numpy_ops, torch_ops):
        self.step_number = number
        head = f"Step {number}. {title} "
        self.raw()
        self.line(head + "=" * max(3, min(self.width, 100) - len(head)), "title", indent="")
        if self.brief:
            return
        self.line(f"NumPy (numpy_attn): {numpy_ops}", "dim")
        if self.torch is not None:
            self.line(f"PyTorch (torch_attn): {torch_ops}", "dim")

    def table(self, key, title, rows, cols, sums=False, index=(), main=False):
        """One table: the NumPy result beside the PyTorch one, then their largest difference.
        ``main`` marks the step's key table, the one ``--brief`` prints."""
        a = self.np[key][index]
        if a.ndim == 1:
            a = a[:, None]
        b = None if self.torch is None else self.torch[key][index].reshape(a.shape)
        if self.brief and not main:
            if b is not None:
                self.diffs.append((self.step_number, title, max_abs_diff(a, b)))
            return
        where = self.np[key].shape
        if index != ():
            where = f"{where}, showing [{', '.join(map(str, np.atleast_1d(index)))}]"
        self.raw()
        if len(f"  {title}  shape {where}") <= self.width:
            self.raw(f"  {self.style('bold', title)}  shape {where}")
        else:                         # the shape on a line of its own
            self.raw(f"  {self.style('bold', title)}")
            self.raw(f"    shape {where}")
        left = term.table_lines(a, rows, cols, self.precision, sums)
        if b is None:
            for text in left:
                self.raw("    " + text)
            return
        right = term.table_lines(b, rows, cols, self.precision, sums)
        if self.brief and right == left:      # one table says it all; the difference follows
            self.raw("    " + self.style("dim", "NumPy, and PyTorch to the digits printed"))
            for text in left:
                self.raw("    " + text)
        else:
            for text in term.side_by_side([("NumPy", left), ("PyTorch", right)], self.width,
                                          self.style):
                self.raw(text)
        self.diff(title, a, b)

    def diff(self, title, a, b):
        d = max_abs_diff(a, b)
        self.diffs.append((self.step_number, title, d))
        kind = "good" if d <= self.tolerance else "bad"
        self.raw("    " + self.style(kind, f"max |NumPy - PyTorch| = {d:.2e}"))

    def same(self, what, key_a, key_b):
        """Say that two ways of computing one thing agree (on the NumPy side, and on the torch side)."""
        if self.brief:
            return
        d = max_abs_diff(self.np[key_a], self.np[key_b])
        text = f"{what}: max |difference| = {d:.2e} (NumPy)"
        if self.torch is not None:
            text += f", {max_abs_diff(self.torch[key_a], self.torch[key_b]):.2e} (PyTorch)"
        self.raw()
        self.line(text)

    def heatmap(self, stem, title, panels):
        """A figure to plot: ``panels`` is [(panel title, key, index)] of (T, T) weights."""
        self.heatmaps.append((stem, title, [(name, self.np[key][index]) for name, key, index in panels]))


def _signed(x, precision):
    """A factor of a written-out product: negative numbers in parentheses."""
    text = term.fmt(x, precision)
    return f"({text})" if text.startswith("-") else text


def _vec(v, precision):
    return "[" + ", ".join(term.fmt(x, precision) for x in v) + "]"


def _worked_dot_products(p, inputs):
    """Step 5's focus: the query of one token against every key, by hand, from the NumPy side.

    Each key's line reads ``q . k = products = score / sqrt(d) = scaled  weight w``; where that is
    wider than the terminal, the written-out products take a line of their own.
    """
    r, prec, i = p.np, p.precision, inputs.focus
    name = inputs.labels[i]
    if p.brief:                       # not printed, still compared
        if p.torch is not None:
            p.diffs.append((p.step_number, f"context of {name!r}",
                            max_abs_diff(r["s5_context"][i], p.torch["s5_context"][i])))
        return
    q = r["q"][i]
    p.raw()
    p.line(f"Follow {name!r} (position {i}, --focus): q_{name} = x_{name} @ W_query = {_vec(q, prec)}", "bold")
    shown = min(len(q), 4)            # write out at most four products per dot product
    terms = []
    for j in range(len(inputs.labels)):
        k = r["k"][j]
        text = " + ".join(f"{_signed(a, prec)}*{_signed(b, prec)}" for a, b in zip(q[:shown], k[:shown], strict=True))
        terms.append(text + (" + ..." if len(q) > shown else ""))
    lw = max(len(label) for label in inputs.labels)
    tw = max(len(t) for t in terms)
    nw = max(len(term.fmt(v, prec)) for v in np.concatenate([r["s5_scores"][i], r["s5_scaled"][i]]))
    rows = []
    for j, label in enumerate(inputs.labels):
        lhs = f"    q_{name} . k_{label:<{lw}} ="
        rhs = (f"{term.fmt(r['s5_scores'][i, j], prec):>{nw}}   / sqrt({inputs.d_out}) = "
               f"{term.fmt(r['s5_scaled'][i, j], prec):>{nw}}   weight {term.fmt(r['s5_weights'][i, j], prec)}")
        rows.append((lhs, terms[j], rhs))
    if max(len(f"{a} {t:<{tw}} = {c}") for a, t, c in rows) <= p.width:
        for lhs, products, rhs in rows:
            p.raw(f"{lhs} {products:<{tw}} = {rhs}")
    else:
        for lhs, products, rhs in rows:
            p.raw(f"{lhs} {products}")
            p.raw(f"{' ' * (len(lhs) - 1)}= {rhs}")
    weights = r["s5_weights"][i]
    p.line(f"weights = softmax(scaled scores) = {_vec(weights, prec)}  (sum {term.fmt(weights.sum(dtype=np.float64), prec)})",
           indent="    ")
    sum_terms = " + ".join(f"{term.fmt(w, prec)}*v_{label}" for w, label in zip(weights, inputs.labels, strict=True))
    p.line(f"context z_{name} = {sum_terms}", indent="    ")
    p.line(f"         = {_vec(r['s5_context'][i], prec)}", indent="    ")
    if p.torch is not None:
        p.line(f"PyTorch z_{name} = {_vec(p.torch['s5_context'][i], prec)}", indent="    ")
        p.diff(f"context of {name!r}", r["s5_context"][i], p.torch["s5_context"][i])


def print_steps(p, inputs):
    tok = inputs.labels
    chan = [f"c{j}" for j in range(inputs.C)]
    dcol = [f"d{j}" for j in range(inputs.d_out)]
    T, C, nh = len(tok), inputs.C, inputs.num_heads
    hs = C // nh

    p.step(1, "GPT-2 tokenization", "tokenizer.encode -> np.ndarray of int64",
           "none: torch has no tokenizer; torch.from_numpy(ids) takes the same ids")
    p.note("token strings: " + " ".join(repr(s) for s in inputs.pieces))
    p.table("ids", "ids = encode(text)", tok, ["id"], main=True)

    p.step(2, "Embedding lookup", "embedding.embedding_forward(ids, wte)", "embedding.embedding(ids, wte)")
    for text in inputs.notes:
        p.note(text)
    p.table("tok", f"x = wte[ids], C = {C} (--dim)", tok, chan, main=True)

    if inputs.positional:
        p.step(3, "Sinusoidal positions, added (--no-positional leaves them out)",
               "positional.sinusoidal_encoding(T, C)", "positional.sinusoidal_encoding(T, C)")
        p.note("PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i+1] = cos(t / 10000^(2i/C))")
        p.table("pe", "PE, sin on even channels, cos on odd", tok, chan)
        p.table("x", "x = x + PE, the input of attention", tok, chan, main=True)
    else:
        p.step(3, "Sinusoidal positions: skipped (--positional adds them)", "-", "-")
        p.line("attention's input is the embeddings alone" +
               (", as in the source example" if inputs.source else ""), "note")

    p.step(4, "Weight-free self-attention",
           "linear.linear_forward (a matmul), softmax.softmax_forward, attention.scaled_dot_product_attention_forward",
           "linear.linear, softmax.softmax, attention.scaled_dot_product_attention")
    p.note("every token's input is its own query, key and value; no weights, no scaling")
    p.table("s4_scores", "scores = x @ x.T", tok, tok)
    p.table("s4_weights", "weights = softmax(scores), each row sums to 1", tok, tok, sums=True, main=True)
    p.heatmap("step4_weight_free", "Step 4: weight-free self-attention weights", [("", "s4_weights", ())])
    p.table("s4_context", "context = weights @ x", tok, chan)
    p.same("scaled_dot_product_attention(x, x, x, scale=1) gives the same context", "s4_context", "s4_sdpa")

    p.step(5, f"Trainable projections to d = {inputs.d_out} (--d-out)",
           "linear.linear_forward, softmax.softmax_forward, attention.scaled_dot_product_attention_forward",
           "linear.linear, softmax.softmax, attention.scaled_dot_product_attention")
    p.table("q", "queries = x @ W_query", tok, dcol)
    p.table("k", "keys = x @ W_key", tok, dcol)
    p.table("v", "values = x @ W_value", tok, dcol)
    p.table("s5_scores", "scores = queries @ keys.T", tok, tok)
    p.table("s5_scaled", f"scaled scores = scores / sqrt({inputs.d_out})", tok, tok)
    p.table("s5_weights", "weights = softmax(scaled scores)", tok, tok, sums=True, main=True)
    p.heatmap("step5_qkv", f"Step 5: weights of softmax(q k^T / sqrt({inputs.d_out}))", [("", "s5_weights", ())])
    p.table("s5_context", "context = weights @ values", tok, dcol)
    p.same("scaled_dot_product_attention(q, k, v) gives the same context", "s5_context", "s5_sdpa")
    _worked_dot_products(p, inputs)

    p.step(6, "The causal mask", "np.tri, np.where, softmax.softmax_forward, attention.scaled_dot_product_attention_forward(..., is_causal=True)",
           "torch.ones(T, T).tril(), masked_fill, softmax.softmax, attention.scaled_dot_product_attention(..., is_causal=True)")
    p.note("a decoder predicts token t+1 from tokens 0..t, so query t must not see the keys after t")
    p.table("s6_mask", "mask: 1 where query (row) may attend to key (column)", tok, tok)
    p.table("s6_masked", "masked scores: -inf above the diagonal", tok, tok)
    p.table("s6_weights", "causal weights = softmax(masked scores)", tok, tok, sums=True, main=True)
    p.heatmap("step6_causal", "Step 6: causal attention weights (grey: masked)", [("", "s6_weights", ())])
    p.table("s6_context", "causal context = causal weights @ values", tok, dcol)
    p.table("s6_change", "what the mask changed: causal context - step 5 context", tok, dcol)
    p.note(f"the last row ({tok[-1]!r}) sees every key and is unchanged; the first sees only itself")
    p.same("is_causal=True in one call gives the same context", "s6_context", "s6_sdpa")

    p.step(7, f"Multi-head attention, {nh} heads of size {hs} (--heads), causal",
           "linear.linear_forward, multi_head.split_heads / merge_heads, attention.scaled_dot_product_attention_forward, "
           "multi_head.multi_head_attention_forward",
           "linear.linear, multi_head.split_heads / merge_heads, attention.scaled_dot_product_attention, "
           "multi_head.multi_head_attention")
    p.note(f"parameters from multi_head.init_multi_head_params({C}, rng): q, k, v, o each w ({C}, {C}), b ({C},)")
    head_cols = [f"h{h}.{j}" if hs > 1 else f"h{h}" for h in range(nh) for j in range(hs)]
    p.table("mh_q", "Q = x @ Wq + bq, columns grouped by head", tok, head_cols, index=0)
    p.table("mh_k", "K = x @ Wk + bk", tok, head_cols, index=0)
    p.table("mh_v", "V = x @ Wv + bv", tok, head_cols, index=0)
    if not p.brief:
        p.raw()
        p.line(f"split_heads(Q, {nh}): (1, {T}, {C}) -> (1, {nh}, {T}, {hs}); head h takes columns "
               f"h*{hs} .. (h+1)*{hs}-1 of Q, K and V")
    for h in range(nh):
        p.table("mh_weights", f"head {h}: causal weights = softmax(Q_h K_h^T / sqrt({hs}))", tok, tok,
                sums=True, index=(0, h))
    p.heatmap("step7_heads", f"Step 7: the causal weights of each of the {nh} heads (grey: masked)",
              [(f"head {h}", "mh_weights", (0, h)) for h in range(nh)])
    p.table("mh_merged", f"merge_heads(head outputs): (1, {nh}, {T}, {hs}) -> (1, {T}, {C})", tok, head_cols, index=0)
    p.table("mh_out", "out = merged @ Wo + bo", tok, chan, index=0, main=True)
    p.same("multi_head_attention_forward(x, params, num_heads, is_causal=True) in one call gives the same out",
           "mh_out", "mh_one_call")
    _print_kv_decoding(p, inputs)


def _print_kv_decoding(p, inputs):
    """Step 8: step 7's heads fed one token at a time, with a key/value cache; each new token's
    out against row t of step 7's (its largest difference), and the cache growing."""
    r, tok = p.np, inputs.labels
    T, C, nh = len(tok), inputs.C, inputs.num_heads
    hs = C // nh
    nkv = r["kv_k"].shape[1]
    itemsize = inputs.dtype.itemsize
    p.step(8, "Decoding with a KV cache, one token at a time",
           "kv_cache.init_kv_cache, multi_head.multi_head_attention_forward(x_t, ..., "
           "kv_cache=cache.layer(0), is_causal=\"bottom_right\")",
           "kv_cache.init_kv_cache, multi_head.multi_head_attention(x_t, ..., "
           "kv_cache=cache.layer(0), is_causal=\"bottom_right\")")
    p.note("a decoder generates one token at a time. Under the causal mask a token's key and value "
           "never change once computed, so a cache keeps them: step t projects only the new token "
           f"x_t (1, 1, {C}), appends its key and value, and its query attends over the t + 1 "
           "cached keys. Its out should be row t of step 7's out.")
    p.note(f"init_kv_cache(1 layer, batch 1, {nkv} kv heads, max_len {T}, head size {hs}, "
           f"{inputs.dtype.name}): bytes per token = 2 (k and v) x 1 layer x {nkv} kv heads x "
           f"{hs} x {itemsize} bytes = {int(r['kv_bytes_per_token'])}; allocated once, "
           f"{int(r['kv_nbytes'])} bytes for all {T} tokens")
    # One row per token: the cache after it, and |out_t - row t of step 7's out| on each side.
    sides = [("NumPy", r)] + ([] if p.torch is None else [("PyTorch", p.torch)])
    cols = ["t", "token", "length", "bytes"] + [name for name, _ in sides]
    rows, worst = [], 0.0
    for t, label in enumerate(tok):
        diffs = [max_abs_diff(side["kv_out"][0, t], side["mh_out"][0, t]) for _, side in sides]
        worst = max(worst, *diffs)
        rows.append([str(t), label, str(int(r["kv_length"][t])), str(int(r["kv_bytes"][t]))]
                    + [f"{d:.2e}" for d in diffs])
    widths = [max(len(c), *(len(row[j]) for row in rows)) for j, c in enumerate(cols)]

    def layout(cells):
        return "    " + "  ".join(f"{c:<{w}}" if j == 1 else f"{c:>{w}}"
                                  for j, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    p.raw()
    p.line("decoding token by token: the cache's length (tokens) and bytes after token t, and "
           "max |out_t - row t of step 7's out|", "bold")
    p.raw(layout(cols))
    for row in rows:
        p.raw(layout(row))
    kind = "good" if worst <= p.tolerance else "bad"
    p.raw("    " + p.style(kind, f"largest over all tokens = {worst:.2e}; bytes = length x "
                                  f"{int(r['kv_bytes_per_token'])} per token"))
    p.same(f"the cached keys after token {T - 1} equal step 7's K heads", "kv_k", "mh_k_heads")
    p.same(f"the cached values after token {T - 1} equal step 7's V heads", "kv_v", "mh_v_heads")
    if not p.brief:
        p.raw()
    p.note(f"each step projected one token: {T} key/value projections in all, where running step 7 "
           f"again on the whole prefix at every token would make 1 + 2 + ... + {T} = "
           f"{T * (T + 1) // 2}.")


def print_summary(p):
    p.raw()
    if p.torch is None:
        p.line("Done: the NumPy side alone (--no-torch).", "title", indent="")
        return
    worst = max(p.diffs, key=lambda d: d[2])
    kind = "good" if worst[2] <= p.tolerance else "bad"
    p.line(f"Done: {len(p.diffs)} tables computed by NumPy and by PyTorch.", "title", indent="")
    p.line(f"largest |NumPy - PyTorch| over all steps = {worst[2]:.2e} (step {worst[0]}, "
           f"{worst[1]}; {p.inputs.dtype.name})", kind)


