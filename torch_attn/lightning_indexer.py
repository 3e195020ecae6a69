"""DeepSeek Sparse Attention's lightning indexer in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/lightning_indexer.py: the queries from the query latent (wq_b), one key head
from x (wk, LayerNorm), rope on the first rope_dim channels of both (half-split for DeepSeek-V3.2,
interleaved for GLM-5), the scores
I(t, s) = sum_j w(t, j) relu(q(t, j) . k(s) / sqrt(D)) with w = x @ weights_proj.w / sqrt(nh),
-inf on hidden keys, the top_k keys of each row (equal scores: the lower key index first); and
the indexer's loss, sum over the rows of KL(p || softmax(I)) over a mask's keys.
"""

import torch

from torch_attn.layer_norm import layer_norm
from torch_attn.linear import linear
from torch_attn.rope import rope as rotate

K_NORM_EPS = 1e-6   # transformers' DeepseekV32Indexer fixes its LayerNorm's eps


def lightning_indexer(x, q_latent, params, top_k, rope_dim, positions=None, attn_mask=None,
                      is_causal=True, rope_theta=10000.0, rope_scaling=None, rope_layout="half", past_keys=None):
    """Index scores and the top-k keys of each query: x (B, T, C), q_latent (B, T, rq) ->
    scores (B, T, S) (-inf where hidden), selected (B, T, S) bool; S = P + T with ``past_keys``
    (B, P, D), the rotated keys of P earlier tokens (decoding), else S = T."""
    B, T, C = x.shape
    nh, D = params["weights_proj"]["w"].shape[1], params["wk"]["w"].shape[1]
    P = 0 if past_keys is None else past_keys.shape[1]                    # keys of earlier tokens
    positions = torch.arange(P, P + T) if positions is None else positions
    q_pos = positions if positions.ndim == 1 else positions[:, None, :]   # (B, T) -> (B, 1, T): all heads
    # The queries: one projection of the latent, the first rope_dim channels of each head turned.
    q = linear(q_latent, params["wq_b"]["w"])                             # (B, T, rq) -> (B, T, nh*D)
    q = q.reshape(B, T, nh, D).transpose(1, 2)                            # -> (B, nh, T, D)
    q_r = rotate(q[..., :rope_dim], q_pos, rope_theta, rope_layout, rope_scaling)
    q = torch.cat([q_r, q[..., rope_dim:]], dim=-1)                       # (B, nh, T, D)
    # The keys: one head from x, layer-normed, then turned alike.
    k = indexer_keys(x, params, rope_dim, positions, rope_theta, rope_scaling, rope_layout)   # (B, T, D)
    if P:   # decoding: the earlier tokens' keys come first
        k = torch.cat([past_keys, k], dim=1)                              # (B, P, D) + (B, T, D) -> (B, S, D)
    # Each head's ReLU'd scores, summed with the query's weight per head.
    logits = (q @ k[:, None].transpose(-1, -2)) * (D ** -0.5)  # (B, nh, T, D) @ (B, 1, D, S) -> (B, nh, T, S)
    relu = torch.relu(logits)                                             # (B, nh, T, S)
    w = linear(x, params["weights_proj"]["w"])                            # (B, T, C) -> (B, T, nh)
    w = w * (nh ** -0.5)                                                  # (B, T, nh)
    scores = torch.einsum("bth,bhts->bts", w, relu)                       # (B, T, nh) x (B, nh, T, S) -> (B, T, S)
    # Hidden keys score -inf, below every visible one.
    visible = _visible(B, T, P, attn_mask, is_causal)                     # (B, T, S)
    scores = scores.masked_fill(~visible, float("-inf"))                  # (B, T, S)
    # The top_k of each row; of equal scores the lower key index first.
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :min(top_k, P + T)]   # -> (B, T, k)
    selected = torch.zeros(scores.shape, dtype=torch.bool)                # (B, T, S)
    selected = selected.scatter(-1, order, True)
    selected = selected & visible                                         # hidden keys never selected
    return scores, selected


def indexer_keys(x, params, rope_dim, positions, rope_theta=10000.0, rope_scaling=None, rope_layout="half"):
    """The rotated keys of x's tokens: x (B, T, C) -> (B, T, D), what a decoder caches."""
    k = linear(x, params["wk"]["w"])                                      # (B, T, C) -> (B, T, D)
    k = layer_norm(k, params["k_norm"]["w"], params["k_norm"]["b"], K_NORM_EPS)
    k_r = rotate(k[..., :rope_dim], positions, rope_theta, rope_layout, rope_scaling)
    return torch.cat([k_r, k[..., rope_dim:]], dim=-1)                    # (B, T, D)


def _visible(B, T, P, attn_mask, is_causal):
    """Which keys each query sees: (B, T, S = P + T) bool, causal (bottom-right: key s <= P + t)
    and attn_mask."""
    visible = torch.ones((B, T, P + T), dtype=torch.bool)                 # (B, T, S)
    if is_causal:
        visible = visible & torch.ones(T, P + T, dtype=torch.bool).tril(P)   # key s <= P + query t
    if attn_mask is not None:
        visible = visible & attn_mask                                     # broadcast to (B, T, S)
    return visible


# -- the indexer's training loss ------------------------------------------------------------------

def lightning_indexer_loss(scores, p, mask=None):
    """sum over the rows of KL(p || softmax(scores)) over the keys of ``mask`` (None: the finite
    scores) -> loss (); p is renormalised over the mask per row and is a constant."""
    mask = torch.isfinite(scores) if mask is None else mask
    p = torch.where(mask, p.detach(), 0)                                  # (B, T, S), a constant
    mass = p.sum(dim=-1, keepdim=True)                                    # (B, T, 1)
    p = p / torch.where(mass > 0, mass, 1)                                # renormalised over the mask
    log_p = torch.log(torch.where(p > 0, p, 1))                           # 0 log 0 = 0
    # softmax(I) over the mask's keys: -inf elsewhere (an empty row's NaN is dropped next).
    log_q = torch.log_softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    log_q = torch.where(mask, log_q, 0)                                   # no -inf meets p's zeros
    loss = torch.sum(p * (log_p - log_q))                                 # (B, T, S) -> ()
    return loss


# Equals transformers' DeepseekV32Indexer ("half") and GlmMoeDsaIndexer ("interleaved"): their
# scores before topk, and their topk's keys where no tie straddles the k-th place; the loss
# equals torch.nn.functional.kl_div(log_q, p, reduction="sum") over the mask.
# parity_tests/test_lightning_indexer.py checks both.
