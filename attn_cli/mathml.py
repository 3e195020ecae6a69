"""The plain-text formulas of the module docstrings as MathML, for the site (numpy-attn site).

The docstrings write their equations for a terminal: ``softmax(x)_i = exp(x_i - m) / sum_j
exp(x_j - m)``, ``k^T``, ``sqrt(hs)``. This converter reads that notation and writes MathML Core,
which browsers typeset themselves: no script and no font is fetched when the page is read, so the
site stays readable offline. It knows only what the docstrings use:

- names become ``<mi>`` (a short final ``_x`` a subscript: ``x_i``, ``head_nh``; Greek names
  spelled out, ``pi``, ``theta``, ``mu``, ``eps``, ``Phi``, become their letters), numbers ``<mn>``;
- ``a^b`` a superscript and ``(...)_i`` a subscript, ``b`` one atom or a bracketed group (its
  brackets dropped);
  ``sqrt(...)`` a root; ``sum_j`` and ``max_j`` an operator with its index below;
- ``*`` is written as a centred dot, ``@`` (the matrix product) stays ``@``, ``->`` an arrow, ``<=``
  and ``>=`` as such;
- a run of two or more plain words (``sum of dout over all rows``, ``unless given``), or one
  joining word (``to``, ``of``, ``if``, ...), is text.

``to_mathml`` raises ValueError on what it cannot read (an unbalanced bracket), so that the site
can warn and show the line as written.
"""

import html
import re

GREEK = {"pi": "π", "theta": "θ", "mu": "μ", "eps": "ε", "Phi": "Φ", "alpha": "α", "beta": "β",
         "sigma": "σ", "lambda": "λ"}
OPERATORS = {"*": "·", "->": "→", "<=": "≤", ">=": "≥", "~": "∼", "..": "…", "...": "…", "-": "−"}
# Words that join the parts of a formula written in words ("integral from 0 to x of ..."): text.
JOINING = {"to", "of", "from", "over", "if", "else", "where", "and", "or", "then", "with", "for",
           "on", "unless", "at", "by", "in", "when", "otherwise"}
BIG = {"sum": "∑", "max": "max", "prod": "∏"}
TOKEN = re.compile(r'\s+|"[^"]*"|\d+(?:\.\d+)?|[A-Za-z][A-Za-z0-9_.]*(?<!\.)'     # space, string, number, name
                   r'|\.\.\.|\.\.|->|<=|>=|[-+*/@=<>~,:;!()\[\]^_|]')
OPENING, CLOSING = {"(": ")", "[": "]"}, {")", "]"}


def tokens(text):
    out, pos = [], 0
    while pos < len(text):
        match = TOKEN.match(text, pos)
        if match is None:
            raise ValueError(f"cannot read {text[pos:]!r} in {text!r}")
        out.append(match.group(0))
        pos = match.end()
    return out


def _name(word):
    """A name as MathML: a short final ``_x`` is a subscript, Greek names their letter."""
    base, _, sub = word.rpartition("_")
    if base and 0 < len(sub) <= 2 and not base.endswith("_"):
        return f"<msub>{_name(base)}{_name(sub)}</msub>"
    if word in GREEK:
        return f"<mi>{GREEK[word]}</mi>"
    if word.isdigit():
        return f"<mn>{word}</mn>"
    return f"<mi>{html.escape(word)}</mi>"


def _is_word(tok):
    return tok.isalpha() and tok not in GREEK and (len(tok) > 1 or tok in JOINING)


class _Reader:
    def __init__(self, text):
        self.toks = tokens(text)
        self.pos = 0

    def peek(self, skip_space=True):
        k = self.pos
        while skip_space and k < len(self.toks) and self.toks[k].isspace():
            k += 1
        return self.toks[k] if k < len(self.toks) else None

    def take(self):
        while self.toks[self.pos].isspace():
            self.pos += 1
        self.pos += 1
        return self.toks[self.pos - 1]

    def row(self, until=None):
        """Atoms up to the closing bracket ``until`` (consumed) or the end."""
        parts = []
        while True:
            tok = self.peek()
            if tok is None:
                if until is not None:
                    raise ValueError(f"no closing {until!r}")
                return "".join(parts)
            if tok in CLOSING:
                if tok != until:
                    raise ValueError(f"unexpected {tok!r}")
                self.take()
                return "".join(parts)
            parts.append(self.words() or self.atom())

    def words(self):
        """A run of two or more plain words, as text (empty when there is none)."""
        k, run = self.pos, []
        while True:
            while k < len(self.toks) and self.toks[k].isspace():
                k += 1
            if k < len(self.toks) and _is_word(self.toks[k]) and (k + 1 >= len(self.toks)
                                                                  or self.toks[k + 1] not in "(_^"):
                run.append(self.toks[k])
                k += 1
            else:
                break
        if not run or (len(run) < 2 and run[0] not in JOINING):
            return ""
        self.pos = k
        return f"<mtext>\u00a0{' '.join(run)}\u00a0</mtext>"

    def group(self):
        """A bracketed group's content, or one atom: the argument of ^, sqrt, or a subscript."""
        if self.peek() in OPENING:
            opening = self.take()
            return f"<mrow>{self.row(OPENING[opening])}</mrow>"
        return self.atom(scripts=False)

    def atom(self, scripts=True):
        tok = self.take()
        if tok in OPENING:
            core = f"<mrow><mo>{tok}</mo>{self.row(OPENING[tok])}<mo>{OPENING[tok]}</mo></mrow>"
        elif tok.startswith('"'):
            core = f"<mtext>{html.escape(tok)}</mtext>"
        elif tok == "sqrt" and self.peek(skip_space=False) == "(":
            self.take()
            core = f"<msqrt>{self.row(')')}</msqrt>"
        elif tok.partition("_")[0] in BIG and tok.count("_") == 1 and tok.partition("_")[2]:
            big, _, index = tok.partition("_")
            core = f'<munder><mo movablelimits="false">{BIG[big]}</mo>{_name(index)}</munder>'
        elif tok[0].isalpha() or tok[0].isdigit():
            core = _name(tok) if not tok[0].isdigit() else f"<mn>{tok}</mn>"
        elif tok == ",":
            return '<mo separator="true">,</mo><mspace width="0.6em"></mspace>'
        else:
            return f"<mo>{html.escape(OPERATORS.get(tok, tok))}</mo>"
        while scripts and self.peek(skip_space=False) in ("^", "_", "!"):
            mark = self.take()
            if mark == "!":
                core = f"<mrow>{core}<mo>!</mo></mrow>"
            else:
                tag = "msup" if mark == "^" else "msub"
                core = f"<{tag}>{core}{self.group()}</{tag}>"
        return core


def segments(line):
    """A formula line's parts: (text, is_math). Parts are separated by three or more spaces (a
    column of notes beside the formulas), but for the spaces that align the "=" of a block; a
    part without "=" after the first is a note, in words."""
    parts = []
    for part in re.split(r"\s{3,}", line.strip()):
        if parts and (part.startswith(("=", "+", "*", "/", "@")) or parts[-1].endswith(":")):
            parts[-1] = f"{parts[-1]} {part}"
        else:
            parts.append(part)
    return [(part, k == 0 or "=" in part) for k, part in enumerate(parts)]


def to_mathml(text):
    """One formula written as in the docstrings -> a ``<math>`` element (display block)."""
    body = _Reader(text.strip()).row()
    return f'<math display="block"><mrow>{body}</mrow></math>'
