"""numpy_attn: the building blocks of a Transformer in pure NumPy, each with a hand-written backward.

Every operation is a pair of pure functions in its own module:

    out, cache = <op>_forward(inputs..., params..., hyper...)
    grads      = <op>_backward(dout, cache)

Its twin in ``torch_attn/<op>.py`` is the same forward in plain PyTorch, whose backward autograd
supplies; ``parity_tests/test_<op>.py`` proves the two agree.

Reading order, leaf to root:

    embedding          token lookup and its scatter-add backward
    positional         sinusoidal position encoding (and learned positions as an embedding)
    softmax            softmax and log-softmax, stable and mask-aware
    linear             x @ w + b with w stored (C_in, C_out)
    softcap            logit softcapping c * tanh(x / c), Gemma 2's, for scores and logits
    dropout            inverted dropout with an explicit random generator
    masks              causal (both alignments), key padding and packed-sequence masks
    attention          scaled dot-product attention: masks, causal, dropout, grouped-query heads
    attention_sinks    gpt-oss's learned sink per head, on attention's output through its log-sum-exp
    kv_cache           the keys and values of past tokens, for decoding
    multi_head         split/merge heads and multi-head (self- or cross-) attention
    small_gpt          the smallest model: embedding + sinusoidal encoding + attention + linear head
    layer_norm         layer normalisation, biased variance, eps inside the square root
    erf                the error function in pure NumPy, to float64 precision
    gelu               GELU, exact (with erf) and tanh-approximated
    feed_forward       linear C -> 4C, GELU, linear 4C -> C
    block              the pre-LayerNorm transformer block
    gpt                GPT (GPT-2's architecture): embeddings, blocks, final layer norm, LM head
    loss               cross-entropy on log-softmax
    optim              AdamW and SGD over nested parameter dicts, and float16's loss scaling
    flash_attention    tiled attention with online softmax: no T x S matrix
    flex_attention     score and mask modifiers, block masks that skip empty tiles
    rope               rotary position embedding: half-split or interleaved, linear or llama3 scaling
    rms_norm           root-mean-square norm (no centring, no bias), as in Llama
    qk_norm            RMS norm on the queries and keys, per head or over the projection
    swiglu             SiLU-gated feed-forward: (silu(x @ gate) * (x @ up)) @ down
    moe                mixture of experts: gpt-oss's and DeepSeek-V3's routers, a loop over experts
    l2_norm            unit-length rows x / sqrt(sum(x^2) + eps): the delta rule's q and k
    causal_conv1d      short causal depthwise convolution over time, with a state for decoding
    gated_rms_norm     RMS norm times silu(z) (Qwen3.5) or sigmoid(z) (Kimi Linear), norm before gate
    gated_delta_rule   the gated delta rule (Gated DeltaNet, Kimi): a decayed state, a loop over time
    chunked_delta_rule the same rule a chunk at a time: the UT transform's matmuls in place of T steps
    gated_deltanet     Qwen3.5's linear-attention sublayer: projections, convolution, the delta rule, gated norm
    kimi_delta_attention Kimi Linear's linear-attention sublayer: Gated DeltaNet with a decay per key channel
    llama              a Llama-style model: RMS norm, RoPE, grouped-query heads, SwiGLU
    qwen3              Qwen3: Llama with QK-norm per head
    qwen3_5            Qwen3.5: Gated DeltaNet in three layers of four, gated attention with partial rotary
    qwen3_next         Qwen3-Next: Qwen3.5 with fused Gated DeltaNet projections and a shared-expert MoE
    olmo2              OLMo 2: Llama with the norms after the sublayers, QK-norm over the projection
    olmo_hybrid        OLMo Hybrid: OLMo 2's attention blocks, Gated DeltaNet pre-norm blocks in three of four
    gemma2             Gemma 2: four norms per block, GeGLU, capped scores and logits, sliding layers
    gemma3             Gemma 3: Gemma 2 with QK-norm, five local layers in six with their own rope base
    gemma4             Gemma 4's text model: norms by w, V-norm, wider global heads, shared keys and values
    gpt_oss            gpt-oss: attention sinks, sliding and full layers, YaRN, a mixture of experts
    mla                multi-head latent attention (DeepSeek-V2/V3) and absorbed latent-cache decoding
    lightning_indexer  DeepSeek Sparse Attention's indexer: ReLU scores, top-k keys per query, its KL loss
    deepseek_v3        DeepSeek-V3: Llama with MLA, dense then mixture-of-experts blocks, absorbed decoding
    deepseek_v32       DeepSeek-V3.2: DeepSeek-V3 whose MLA attends over the lightning indexer's top-k keys
    glm_moe_dsa        GLM-5: DeepSeek-V3.2 with interleaved indexer rope, shared layers reusing a selection
    llama4             Llama 4's text model: chunked rotary and NoPE layers, sigmoid-routed experts
    kimi_linear        Kimi Linear: Kimi Delta Attention in three layers of four, MLA without positions, experts

Tuned versions of an operation (no twin, tested against the readable one) live in
``numpy_attn/kernels/``. The ``numpy-attn`` command (walkthrough, show, tokenize, train, generate)
lives in the sibling package ``attn_cli``, which imports this one, never the reverse.

Dimension key (the same in torch_attn and the README):

    B   batch                 T   query length          S   key length
    C   model width           nh  heads                 hs  head size (C = nh * hs)
    V   vocabulary size

Importing this package imports NumPy only, never torch (the tokenizer lives in attn_cli).
"""

__version__ = "0.1.0"

# Every operation's public functions, importable from the package (``from numpy_attn import
# softmax_forward``); each also stays in its module. Left in their modules: ``erf`` (the module's
# own name) and flex_attention's mask and score modifiers (``causal``, ``sliding_window``, ...:
# names too general here).
from numpy_attn.attention import (
    scaled_dot_product_attention_backward, scaled_dot_product_attention_forward,
)
from numpy_attn.attention_sinks import attention_sinks_backward, attention_sinks_forward
from numpy_attn.block import block_backward, block_forward, init_block_params
from numpy_attn.causal_conv1d import causal_conv1d_backward, causal_conv1d_forward
from numpy_attn.chunked_delta_rule import chunked_delta_rule_backward, chunked_delta_rule_forward
from numpy_attn.deepseek_v3 import (
    DeepseekV3Config, deepseek_moe_mlp_forward, deepseek_v3_attention_backward, deepseek_v3_attention_forward,
    deepseek_v3_backward, deepseek_v3_block_backward, deepseek_v3_block_forward,
    deepseek_v3_forward, deepseek_v3_kv_cache, init_deepseek_v3_params,
)
from numpy_attn.deepseek_v32 import (
    DeepseekV32Config, deepseek_v32_attention_backward, deepseek_v32_attention_forward, deepseek_v32_backward,
    deepseek_v32_forward, deepseek_v32_indexer_loss, deepseek_v32_indexer_loss_backward, deepseek_v32_kv_cache,
    dsa_decoder_forward, dsa_layer_options, init_deepseek_v32_params,
)
from numpy_attn.dropout import dropout_backward, dropout_forward
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.feed_forward import (
    feed_forward_backward, feed_forward_forward, init_feed_forward_params,
)
from numpy_attn.flash_attention import flash_attention_backward, flash_attention_forward
from numpy_attn.flex_attention import (
    create_block_mask, dense_flex_attention_forward, flex_attention_backward,
    flex_attention_forward,
)
from numpy_attn.gated_delta_rule import (
    gated_delta_rule_backward, gated_delta_rule_forward, gated_delta_rule_parallel_forward,
)
from numpy_attn.gated_deltanet import (
    check_sublayer_inputs, delta_rule_backward, delta_rule_forward, gated_deltanet_backward, gated_deltanet_forward,
    log_decay_backward, log_decay_forward, opmath_sublayer_inputs, rounded_tree,
)
from numpy_attn.gated_rms_norm import gated_rms_norm_backward, gated_rms_norm_forward
from numpy_attn.kimi_delta_attention import (
    kimi_delta_attention_backward, kimi_delta_attention_forward, kimi_delta_attention_param_shapes,
)
from numpy_attn.kimi_linear import (
    KimiLinearConfig, init_kimi_linear_params, kimi_attention_forward, kimi_linear_backward, kimi_linear_forward,
    kimi_linear_kv_cache,
)
from numpy_attn.gelu import gelu_backward, gelu_forward
from numpy_attn.glm_moe_dsa import (
    GlmMoeDsaConfig, glm_moe_dsa_backward, glm_moe_dsa_forward, glm_moe_dsa_kv_cache, init_glm_moe_dsa_params,
)
from numpy_attn.gemma2 import (
    Gemma2Config, gemma2_attention_forward, gemma2_backward, gemma2_block_backward, gemma2_block_forward,
    gemma2_forward, gemma2_kv_cache, gemma_decoder_forward, init_gemma2_params,
)
from numpy_attn.gemma3 import (
    Gemma3Config, gemma3_attention_forward, gemma3_backward, gemma3_forward, init_gemma3_params,
)
from numpy_attn.gemma4 import (
    Gemma4Config, gemma4_attention_backward, gemma4_attention_forward, gemma4_backward, gemma4_block_backward,
    gemma4_block_forward, gemma4_forward, gemma4_kv_cache, gemma4_moe_backward, gemma4_moe_forward,
    gemma4_per_layer_backward, gemma4_per_layer_forward, gemma4_per_layer_inputs_backward,
    gemma4_per_layer_inputs_forward, gemma4_rotate_backward, gemma4_rotate_forward, gemma4_router_backward,
    gemma4_router_forward, init_gemma4_params,
)
from numpy_attn.gpt import GPTConfig, gpt_backward, gpt_forward, gpt_kv_cache, init_gpt_params
from numpy_attn.gpt_oss import (
    GptOssConfig, gpt_oss_attention_backward, gpt_oss_attention_forward, gpt_oss_backward,
    gpt_oss_block_backward, gpt_oss_block_forward, gpt_oss_forward, gpt_oss_kv_cache, gpt_oss_mlp_forward,
    init_gpt_oss_params,
)
from numpy_attn.kv_cache import init_kv_cache, kv_cache_update
from numpy_attn.l2_norm import l2_norm_backward, l2_norm_forward
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.llama import (
    LlamaConfig, init_llama_params, llama_attention_backward, llama_attention_forward, llama_backward,
    llama_block_backward, llama_block_forward, llama_forward, llama_kv_cache, swiglu_mlp_forward,
)
from numpy_attn.lightning_indexer import (
    indexer_keys, lightning_indexer_backward, lightning_indexer_forward, lightning_indexer_loss_backward,
    lightning_indexer_loss_forward,
)
from numpy_attn.llama4 import (
    Llama4Config, attention_temperature, chunked_causal_mask, init_llama4_params, leading_padding,
    llama4_attention_backward, llama4_attention_forward, llama4_backward, llama4_block_forward, llama4_forward,
    llama4_kv_cache,
    llama4_moe_backward, llama4_moe_forward, llama4_moe_mlp_forward, llama4_router_backward, llama4_router_forward,
    qk_unit_rms_backward, qk_unit_rms_forward,
)
from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward
from numpy_attn.masks import (
    causal_mask, padded_position_ids, padding_attn_mask, sliding_window_mask, varlen_attn_mask,
    varlen_position_ids, varlen_sequence_ids,
)
from numpy_attn.mla import (
    MLAConfig, init_latent_cache, init_mla_kv_cache, init_mla_params, latent_cache_update, mla_absorbed_forward,
    mla_backward, mla_cache_bytes_per_token, mla_forward, mla_param_shapes, mla_softmax_scale,
)
from numpy_attn.moe import (
    clamped_glu_backward, clamped_glu_forward, deepseek_moe_backward, deepseek_moe_forward,
    deepseek_router_backward, deepseek_router_forward, expert_params, experts_backward, experts_forward,
    gpt_oss_expert_backward, gpt_oss_expert_forward, gpt_oss_moe_backward, gpt_oss_moe_forward,
    gpt_oss_router_backward, gpt_oss_router_forward, init_deepseek_moe_params, init_gpt_oss_moe_params,
    top_k,
)
from numpy_attn.multi_head import (
    init_multi_head_params, merge_heads, multi_head_attention_backward,
    multi_head_attention_forward, split_heads,
)
from numpy_attn.olmo2 import (
    Olmo2Config, init_olmo2_params, olmo2_attention_backward, olmo2_attention_forward, olmo2_backward,
    olmo2_block_backward, olmo2_block_forward, olmo2_forward,
)
from numpy_attn.optim import (
    adamw_init,
    adamw_step,
    loss_scale_init,
    loss_scale_update,
    sgd_init,
    sgd_step,
    unscale_grads,
)
from numpy_attn.olmo_hybrid import (
    OlmoHybridConfig, init_olmo_hybrid_params, olmo_hybrid_backward, olmo_hybrid_block_backward,
    olmo_hybrid_block_forward, olmo_hybrid_forward, olmo_hybrid_linear_attention_backward,
    olmo_hybrid_linear_attention_forward,
)
from numpy_attn.positional import sinusoidal_encoding
from numpy_attn.qk_norm import qk_norm_backward, qk_norm_forward
from numpy_attn.qwen3 import (
    Qwen3Config, init_qwen3_params, qwen3_attention_backward, qwen3_attention_forward, qwen3_backward,
    qwen3_forward,
)
from numpy_attn.qwen3_5 import (
    Qwen3_5Config, check_layer_types, gated_attention_backward, gated_attention_forward, hybrid_decoder_forward,
    init_qwen3_5_params, linear_attention_backward,
    linear_attention_forward, qwen3_5_backward, qwen3_5_forward, qwen3_5_kv_cache, state_sublayer,
)
from numpy_attn.qwen3_next import (
    Qwen3NextConfig, fused_columns, init_qwen3_next_params, linear_attention_fused_backward,
    linear_attention_fused_forward, qwen3_next_backward, qwen3_next_forward, qwen3_next_moe_backward,
    qwen3_next_moe_forward, qwen3_next_moe_mlp_forward, qwen3_next_router_backward, qwen3_next_router_forward,
    unfused_params,
)
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.rope import (
    half_to_interleaved, rope_attention_factor, rope_backward, rope_forward, rope_frequencies,
)
from numpy_attn.small_gpt import init_small_gpt_params, small_gpt_backward, small_gpt_forward
from numpy_attn.softcap import logit_softcap_backward, logit_softcap_forward
from numpy_attn.softmax import (
    log_softmax_backward, log_softmax_forward, softmax_backward, softmax_forward,
)
from numpy_attn.swiglu import (
    init_swiglu_params, sigmoid, silu_backward, silu_forward, swiglu_backward, swiglu_forward,
)
