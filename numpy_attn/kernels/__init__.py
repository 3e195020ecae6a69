"""Tuned versions of numpy_attn operations: same results, faster, harder to read.

Each kernel has no torch twin; its parity tests compare it with the readable operation it speeds
up, and its docstring lists each trick against that readable version.
"""
