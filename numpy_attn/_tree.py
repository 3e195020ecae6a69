"""Nested parameter dicts ("trees"): map over them leaf by leaf, flatten them to dotted paths and
back. Parameters of every model here are such dicts, e.g. ``{"q": {"w": ..., "b": ...}, ...}``;
a leaf is anything that is not a dict. NumPy-free: leaves are never looked into.
"""


def _join(path, key):
    return f"{path}.{key}" if path else str(key)


def tree_map(fn, tree, *others, check=None, path=""):
    """``fn(leaf, *other_leaves)`` at every leaf of ``tree`` and of ``others`` (trees with the same
    keys), as a tree of the same shape.

    Raises ValueError naming the path where the keys differ; ``check(path, leaf, *other_leaves)``,
    when given, is called at every leaf before ``fn`` (to validate it).
    """
    if isinstance(tree, dict):
        for other in others:
            if not isinstance(other, dict) or other.keys() != tree.keys():
                keys = sorted(other) if isinstance(other, dict) else type(other).__name__
                raise ValueError(f"trees differ at '{path or '<root>'}': keys {sorted(tree)} "
                                 f"!= {keys}")
        return {k: tree_map(fn, v, *(o[k] for o in others), check=check, path=_join(path, k))
                for k, v in tree.items()}
    if check is not None:
        check(path or "<root>", tree, *others)
    return fn(tree, *others)


def tree_pick(tree, i):
    """Element ``i`` of every tuple leaf: turns a tree of tuples into one of the tuples' parts."""
    return tree_map(lambda leaf: leaf[i], tree)


def leaves(tree):
    """(dotted path, leaf) pairs of ``tree`` in its key order, e.g. ("blocks.0.attn.q.w", array)."""
    if isinstance(tree, dict):
        return [(_join(k, path) if path else str(k), leaf)
                for k, sub in tree.items() for path, leaf in leaves(sub)]
    return [("", tree)]


def flatten(tree):
    """``{dotted path: leaf}`` of ``tree``; ``unflatten`` inverts it."""
    return dict(leaves(tree))


def unflatten(flat):
    """The tree whose ``flatten`` is ``flat`` (dotted paths; every part becomes a str key)."""
    tree = {}
    for path, leaf in flat.items():
        *parents, name = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = leaf
    return tree


def rebuild(tree, values):
    """A tree shaped like ``tree`` holding ``values`` (an iterable, in ``leaves`` order)."""
    values = iter(values)
    return tree_map(lambda _: next(values), tree)
