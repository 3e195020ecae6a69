"""``numpy-attn tokenize``: the GPT-2 token ids and text pieces of a text."""


from attn_cli import term

HELP = "print the GPT-2 token ids and strings of TEXT"

EXAMPLES = """examples:
  numpy-attn tokenize "The cat sat on the mat"
  numpy-attn tokenize "naïve café"              a piece may be part of a multi-byte character
"""


def add_arguments(p):
    term.describe(p, ("Split TEXT into GPT-2 byte-pair tokens (tiktoken's gpt2 encoding) and print "
                     "each token's position, id and text piece. Needs the GPT-2 vocabulary: "
                     "downloaded on first use, or read from the folder TIKTOKEN_CACHE_DIR names."), EXAMPLES)
    p.add_argument("text", metavar="TEXT", help="the text to split into tokens (quote it)")


def run(args):
    from attn_cli import tokenizer

    ids = tokenizer.encode(args.text)
    pieces = tokenizer.token_strings(ids)
    print(f"{len(ids)} GPT-2 tokens")
    print(f"{'pos':>4}  {'id':>6}  token")
    for pos, (i, piece) in enumerate(zip(ids, pieces, strict=True)):
        print(f"{pos:>4}  {i:>6}  {term.printable(repr(piece))}")
    return 0
