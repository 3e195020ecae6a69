"""GPT-2 byte-pair encoding through tiktoken, imported on first use.

tiktoken downloads GPT-2's vocabulary the first time it is asked for it and caches it in the folder
named by ``TIKTOKEN_CACHE_DIR``. On a machine without internet, point that variable at a folder
that already holds tiktoken's cached GPT-2 files; otherwise every function here raises
``TokenizerUnavailable`` saying so.
"""

import os

_ENCODING = None

OFFLINE_HELP = (
    "tiktoken could not load GPT-2's vocabulary: it downloads it on first use and caches it in "
    "the folder named by TIKTOKEN_CACHE_DIR. To work offline, set TIKTOKEN_CACHE_DIR to a folder "
    "that already holds tiktoken's cached GPT-2 files (e.g. export "
    "TIKTOKEN_CACHE_DIR=/path/to/tiktoken_cache, a copy of the folder from a machine where "
    "tiktoken has run once), or run once with internet access."
)


class TokenizerUnavailable(RuntimeError):
    """The GPT-2 vocabulary (or tiktoken itself) cannot be loaded on this machine."""


def get_encoding():
    """Return tiktoken's GPT-2 encoding, loading it once; raise TokenizerUnavailable if impossible."""
    global _ENCODING
    if _ENCODING is None:
        try:
            import tiktoken
        except ImportError as err:
            raise TokenizerUnavailable(
                "tiktoken is not installed: pip install tiktoken"
            ) from err
        try:
            _ENCODING = tiktoken.get_encoding("gpt2")
        except Exception as err:  # network errors come as requests/urllib/OSError types
            cache = os.environ.get("TIKTOKEN_CACHE_DIR", "(unset)")
            raise TokenizerUnavailable(
                f"{OFFLINE_HELP}\nTIKTOKEN_CACHE_DIR is {cache}; the error was: "
                f"{type(err).__name__}: {err}"
            ) from err
    return _ENCODING


def encode(text):
    """GPT-2 token ids of ``text`` as a list of ints."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return get_encoding().encode_ordinary(text)


def decode(ids):
    """The text of GPT-2 token ids ``ids`` (a list or integer array); inverse of ``encode``."""
    enc = get_encoding()
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < enc.n_vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range for GPT-2's vocabulary of {enc.n_vocab}")
    return enc.decode(ids)


def token_strings(ids):
    """The text piece of each id (a piece may be part of a multi-byte character)."""
    enc = get_encoding()
    return [enc.decode_single_token_bytes(int(i)).decode("utf-8", errors="replace") for i in ids]
