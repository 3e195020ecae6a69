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


def spacing(dtype, value):
    """The distance from |value| to the next larger number of ``dtype`` (its ulp there)."""
    return float(np.spacing(np.abs(np.asarray(value, dtype=dtype))))


def tolerance(dtype, results):
    """The largest |NumPy - PyTorch| a table may show and be marked good. float32, float64: their
    rounding level. float16, bfloat16: every operation on both sides computes in float32 and rounds
    once, so the two differ only where float32's different summation orders fall on either side of a
    rounding boundary: one ulp, and one more inherited from an earlier step; two ulps at the largest
    value the walkthrough shows."""
    if dtype.name not in ("float16", "bfloat16"):
        return 1e-4 if dtype == np.float32 else 1e-10
    largest = max(float(np.max(np.abs(a[np.isfinite(a)]), initial=0)) for a in results.values()
                  if a.dtype == dtype)
    return 2 * spacing(dtype, largest)


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
        self.tolerance = tolerance(inputs.dtype, results["NumPy"])
        self.diffs = []               # (step, table title, max |NumPy - PyTorch|)
        self.heatmaps = []            # (file stem, title, [(panel title, values (T, T))], signed)
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

    def table(self, key, title, rows, cols, sums=False, index=(), main=False, undoes=None, shared=False):
        """One table: the NumPy result beside the PyTorch one, then their largest difference.
        ``main`` marks the step's key table, the one ``--brief`` prints; ``undoes`` names the
        forward line a gradient undoes; ``shared`` marks an input both sides are given, printed
        once and not compared."""
        a = self.np[key][index]
        if a.ndim == 1:
            a = a[:, None]
        b = None if self.torch is None or shared else self.torch[key][index].reshape(a.shape)
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
            self.line(title, "bold")
            self.raw(f"    shape {where}")
        if undoes is not None:
            self.line(f"undoes {undoes}", "dim", indent="    ")
        blocks = [("NumPy", a)] if b is None else [("NumPy", a), ("PyTorch", b)]
        whole = [term.table_lines(x, rows, cols, self.precision, sums) for _, x in blocks]
        if shared and self.torch is not None:
            blocks = [("NumPy and PyTorch, the same input", a)]
        elif b is not None and self.brief and whole[0] == whole[1]:   # one table says it all
            blocks, whole = [("NumPy and PyTorch alike", a)], whole[:1]
        self._table_blocks(blocks, whole, rows, cols, sums)
        if b is not None:
            self.diff(title, a, b)

    def _table_blocks(self, blocks, whole, rows, cols, sums):
        """Print [(label, array)]: beside each other, else one under another, else (wider than the
        terminal alone) cut into groups of columns, each side's part of a group under its label."""
        if max(len(text) for lines in whole for text in lines) <= self.width - 4:
            if len(blocks) == 2:
                for text in term.side_by_side(list(zip(("NumPy", "PyTorch"), whole, strict=True)), self.width,
                                              self.style):
                    self.raw(text)
                return
            if self.torch is not None:        # no label alone on the NumPy side (--no-torch)
                self.line(blocks[0][0], "dim", indent="    ")
            for text in whole[0]:
                self.raw("    " + text)
            return
        groups = term.column_groups([x for _, x in blocks], rows, cols, self.precision, self.width - 4, sums)
        for names, tables in groups:
            part = f"columns {names[0]} to {names[-1]}" if len(names) > 1 else f"column {names[0]}"
            for (label, _), lines in zip(blocks, tables, strict=True):
                self.line(f"{label}, {part}" if self.torch is not None else part, "dim", indent="    ")
                for text in lines:
                    self.raw("    " + text)

    def diff(self, title, a, b):
        d = max_abs_diff(a, b)
        self.diffs.append((self.step_number, title, d))
        kind = "good" if d <= self.tolerance else "bad"
        self.raw("    " + self.style(kind, f"max |NumPy - PyTorch| = {d:.2e}"))

    def same(self, what, key_a, key_b):
        """Say that two ways of computing one thing agree (on the NumPy side, and on the torch side).
        A key may be a tuple of keys: the arrays they name, compared together."""
        if self.brief:
            return

        def get(r, keys):
            return np.concatenate([np.ravel(r[key]) for key in keys]) if isinstance(keys, tuple) else r[keys]

        d = max_abs_diff(get(self.np, key_a), get(self.np, key_b))
        text = f"{what}: max |difference| = {d:.2e} (NumPy)"
        if self.torch is not None:
            text += f", {max_abs_diff(get(self.torch, key_a), get(self.torch, key_b)):.2e} (PyTorch)"
        self.raw()
        self.line(text)

    def heatmap(self, stem, title, panels, signed=False):
        """A figure to plot: ``panels`` is [(panel title, key, index)] of (T, T) weights, or of
        gradients with ``signed`` (a scale symmetric about 0)."""
        self.heatmaps.append((stem, title, [(name, self.np[key][index]) for name, key, index in panels], signed))


def _signed(x, precision):
    """A factor of a written-out product: negative numbers in parentheses."""
    text = term.fmt(x, precision)
    return f"({text})" if text.startswith("-") else text


def _vec(v, precision):
    return "[" + ", ".join(term.fmt(x, precision) for x in v) + "]"


def _worked_lines(p, rows, indent="    "):
    """Written-out sums ``lhs terms... = rhs``, rows of (lhs, [terms], rhs), one under another.

    Each on one line, the "=" aligned, when they fit; else the terms on one line and "= rhs" under
    them; else (a narrow terminal, long labels, many decimals) wrapped between terms and between
    the parts of rhs (split by three spaces), every line within the width.
    """
    sums = [" + ".join(terms) for _, terms, _ in rows]
    tw = max(len(text) for text in sums)
    one_line = [f"{indent}{lhs} {text:<{tw}} = {rhs}" for (lhs, _, rhs), text in zip(rows, sums, strict=True)]
    two_lines = [(f"{indent}{lhs} {text}", f"{indent}{' ' * (len(lhs) - 1)}= {rhs}")
                 for (lhs, _, rhs), text in zip(rows, sums, strict=True)]
    if max(len(line) for line in one_line) <= p.width:
        lines = one_line
    elif max(len(line) for pair in two_lines for line in pair) <= p.width:
        lines = [line for pair in two_lines for line in pair]
    else:
        lines = []
        for lhs, terms, rhs in rows:
            pieces = [lhs] + [t + " +" for t in terms[:-1]] + terms[-1:] + ["="] + [
                part.strip() for part in rhs.split("   ") if part.strip()]
            lines += term.wrap_pieces(pieces, p.width, indent)
    for line in lines:
        p.raw(line)


def _worked_dot_products(p, inputs):
    """Step 5's focus: the query of one token against every key, by hand, from the NumPy side.

    Each key's line reads ``q . k = products = score / sqrt(d) = scaled  weight w`` (laid out
    for the width by ``_worked_lines``).
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
    nw = max(len(term.fmt(v, prec)) for v in np.concatenate([r["s5_scores"][i], r["s5_scaled"][i]]))
    rows = []
    for j, label in enumerate(inputs.labels):
        rhs = (f"{term.fmt(r['s5_scores'][i, j], prec):>{nw}}   / sqrt({inputs.d_out}) = "
               f"{term.fmt(r['s5_scaled'][i, j], prec):>{nw}}   weight {term.fmt(r['s5_weights'][i, j], prec)}")
        rows.append((f"q_{name} . k_{label:<{lw}} =", terms[j].split(" + "), rhs))
    _worked_lines(p, rows)
    weights = r["s5_weights"][i]
    total = term.fmt(weights.sum(dtype=np.float64), prec)
    p.line(f"weights = softmax(scaled scores) = {_vec(weights, prec)}  (sum {total})", indent="    ")
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

    p.step(6, "The causal mask",
           "np.tri, np.where, softmax.softmax_forward, "
           "attention.scaled_dot_product_attention_forward(..., is_causal=True)",
           "torch.ones(T, T).tril(), masked_fill, softmax.softmax, "
           "attention.scaled_dot_product_attention(..., is_causal=True)")
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
           "linear.linear_forward, multi_head.split_heads / merge_heads, "
           "attention.scaled_dot_product_attention_forward, "
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
    _print_backward(p, inputs)


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
    p.line(f"largest over all tokens = {worst:.2e}; bytes = length x {int(r['kv_bytes_per_token'])} per token",
           kind, indent="    ")
    p.same(f"the cached keys after token {T - 1} equal step 7's K heads", "kv_k", "mh_k_heads")
    p.same(f"the cached values after token {T - 1} equal step 7's V heads", "kv_v", "mh_v_heads")
    if not p.brief:
        p.raw()
    p.note(f"each step projected one token: {T} key/value projections in all, where running step 7 "
           f"again on the whole prefix at every token would make 1 + 2 + ... + {T} = "
           f"{T * (T + 1) // 2}.")


def _print_backward(p, inputs):
    """Step 9: step 5's attention run backward from L = sum(context * G), each gradient by hand
    (numpy_attn's backward functions) beside autograd's, and the focus token's row of dscores
    through the softmax's Jacobian worked out."""
    tok, d = inputs.labels, inputs.d_out
    dcol = [f"d{j}" for j in range(d)]
    chan = [f"c{j}" for j in range(inputs.C)]
    p.step(9, "The backward of step 5: gradients by hand and by autograd",
           "linear.linear_backward, softmax.softmax_backward, attention.scaled_dot_product_attention_backward",
           "loss.backward() (autograd), each gradient read from .grad")
    p.note("a loss to send back: L = sum(context * G), with G a fixed (T, d) matrix drawn from N(0, 1) "
           "and rounded to 2 decimals, so that dL/dcontext = G. G is the upstream gradient: what the "
           "layers above would send down. It is drawn, not all ones, so that a swapped row or a missing "
           "transpose shows in the numbers: G all ones would give every query the same row of dweights, "
           "and dweights all ones would make the softmax's gradient vanish (w * (1 - sum(w)) = 0).")
    p.table("s9_upstream", "G = dL/dcontext, the upstream gradient", tok, dcol, shared=True)
    if not p.brief:
        p.raw()
        text = f"L = sum(context * G) = {term.fmt(p.np['s9_loss'], p.precision)} (NumPy)"
        if p.torch is not None:
            text += f", {term.fmt(p.torch['s9_loss'], p.precision)} (PyTorch)"
        p.line(text)
    if p.torch is not None:
        if p.brief:
            p.diffs.append((p.step_number, "L", max_abs_diff(p.np["s9_loss"], p.torch["s9_loss"])))
        else:
            p.diff("L", p.np["s9_loss"], p.torch["s9_loss"])
    context = "context = weights @ values"
    p.table("s9_dweights", "dweights = G @ values.T", tok, tok, undoes=context)
    p.table("s9_dv", "dv = weights.T @ G", tok, dcol, undoes=context)
    p.table("s9_dscores", "dscores = weights * (dweights - rowsum(weights * dweights))",
            tok, tok, sums=True, main=True, undoes="weights = softmax(scaled scores)")
    p.note("each row of dscores sums to 0: adding one number to a row of scores leaves its softmax as it was, "
           "so the loss cannot change along that direction")
    p.heatmap("step9_dscores", "Step 9: dscores = dL/d(scaled scores),\nthrough the softmax's Jacobian",
              [("", "s9_dscores", ())], signed=True)
    _worked_softmax_backward(p, inputs)
    scores = f"scaled scores = queries @ keys.T / sqrt({d})"
    p.table("s9_dq", f"dq = dscores @ keys / sqrt({d})", tok, dcol, undoes=scores)
    p.table("s9_dk", f"dk = dscores.T @ queries / sqrt({d})", tok, dcol, undoes=scores)
    for name in ("query", "key", "value"):
        p.table(f"s9_dw_{name}", f"dW_{name} = x.T @ d{name[0]}", chan, dcol, undoes=f"{name[0]} = x @ W_{name}")
    p.same("scaled_dot_product_attention_backward(G, cache) in one call gives the same dq, dk, dv",
           ("s9_dq", "s9_dk", "s9_dv"), ("s9_sdpa_dq", "s9_sdpa_dk", "s9_sdpa_dv"))


def _worked_softmax_backward(p, inputs):
    """Step 9's focus: its row of dweights from G, through the softmax's Jacobian to dscores, then
    its dq, by hand from the NumPy side."""
    r, prec, i = p.np, p.precision, inputs.focus
    tok, d = inputs.labels, inputs.d_out
    name = tok[i]
    if p.brief:                       # not printed, still compared
        if p.torch is not None:
            p.diffs.append((p.step_number, f"dq of {name!r}", max_abs_diff(r["s9_dq"][i], p.torch["s9_dq"][i])))
        return
    g, w, dw, ds = r["s9_upstream"][i], r["s5_weights"][i], r["s9_dweights"][i], r["s9_dscores"][i]
    p.raw()
    p.line(f"Follow {name!r} back (--focus): G_{name} = dL/dz_{name} = {_vec(g, prec)}; w_j is its weight "
           f"on key j (step 5), dw_j = dL/dw_j, dscore_j = dL/d(scaled score j)", "bold")
    shown = min(d, 4)                 # write out at most four products per dot product
    lw = max(len(label) for label in tok)
    nw = max(len(term.fmt(v, prec)) for v in np.concatenate([dw, ds]))
    rows = []
    for j, label in enumerate(tok):
        terms = [f"{_signed(a, prec)}*{_signed(b, prec)}" for a, b in zip(g[:shown], r["v"][j][:shown], strict=True)]
        rows.append((f"dw_{label:<{lw}} = G_{name} . v_{label:<{lw}} =", terms + (["..."] if d > shown else []),
                     f"{term.fmt(dw[j], prec):>{nw}}"))
    _worked_lines(p, rows)
    total = (w * dw).sum(dtype=np.float64)
    products = " + ".join(f"{term.fmt(a, prec)}*{_signed(b, prec)}" for a, b in zip(w, dw, strict=True))
    p.line(f"sum_k w_k dw_k = {products} = {term.fmt(total, prec)}", indent="    ")
    rows = [(f"dscore_{label:<{lw}} = w_{label:<{lw}} (dw_{label:<{lw}} - sum) =",
             [f"{term.fmt(w[j], prec)}*({term.fmt(dw[j], prec)} - {_signed(total, prec)})"],
             f"{term.fmt(ds[j], prec):>{nw}}")
            for j, label in enumerate(tok)]
    _worked_lines(p, rows)
    p.line(f"dq_{name} = (dscores_{name} @ keys) / sqrt({d}) = ("
           + " + ".join(f"{_signed(a, prec)}*k_{label}" for a, label in zip(ds, tok, strict=True)) + f") / sqrt({d})",
           indent="    ")
    p.line(f"      = {_vec(r['s9_dq'][i], prec)}", indent="    ")
    if p.torch is not None:
        p.line(f"PyTorch dq_{name} = {_vec(p.torch['s9_dq'][i], prec)}", indent="    ")
        p.diff(f"dq of {name!r}", r["s9_dq"][i], p.torch["s9_dq"][i])


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


