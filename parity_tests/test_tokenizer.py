"""Tests for attn_cli/tokenizer.py (GPT-2 BPE through tiktoken).

Tests that need the vocabulary skip with a reason when it cannot be loaded (no internet and no
TIKTOKEN_CACHE_DIR); the offline error itself is tested in a subprocess with no reachable network.
"""

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_cli import tokenizer
from parity_tests.helpers import needs_vocab


@needs_vocab
def test_known_ids():
    """GPT-2's real ids for the README's sentence (as published in GPT-2's encoder.json)."""
    assert tokenizer.encode("The cat sat on the mat") == [464, 3797, 3332, 319, 262, 2603]
    assert tokenizer.token_strings([464, 3797]) == ["The", " cat"]


@needs_vocab
@given(text=st.text(max_size=60))
def test_round_trip(text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@needs_vocab
def test_bad_input():
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        tokenizer.encode(b"bytes")
    with pytest.raises(ValueError, match="token id 50257 is out of range for GPT-2's vocabulary of 50257"):
        tokenizer.decode([1, 50257])


def test_offline_without_cache_says_what_to_set(tmp_path):
    """With an empty cache folder and no network, the error names TIKTOKEN_CACHE_DIR."""
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path),
               # A proxy on a closed local port makes every download fail at once, also on a
               # machine with internet, so this test never reaches the network.
               HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", NO_PROXY="")
    code = ("from attn_cli import tokenizer\n"
            "try:\n    tokenizer.encode('hi')\n"
            "except tokenizer.TokenizerUnavailable as err:\n    print(err)\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "TIKTOKEN_CACHE_DIR" in result.stdout, result.stdout
    assert "offline" in result.stdout, result.stdout
    assert str(tmp_path) in result.stdout, "the message should show the folder that was tried"
