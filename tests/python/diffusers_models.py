"""One tiny, randomly initialised diffusers transformer of each family stsa.diffusers
knows, and what the tests need to know of each (test_diffusers.py). Imported only after
pytest.importorskip("diffusers")."""

import dataclasses
import importlib
import operator
from typing import Any, Callable

import diffusers
import numpy as np
import pytest
import torch
from diffusers.models import attention_processor

import stsa
from diffusers_helpers import TEXT_DIM, TEXT_TOKENS


def _transformers_module(name):
    """diffusers.models.transformers.<name>, or None where this diffusers has no such family."""
    try:
        return importlib.import_module(f"diffusers.models.transformers.{name}")
    except ImportError:
        return None


def _has(module, *attributes):
    """Whether this diffusers has the module and what a family's definition below takes from it:
    the families it lacks are None here, and their tests skip (see `param` and `needs`)."""
    return module is not None and all(hasattr(module, attribute) for attribute in attributes)


transformer_allegro = _transformers_module("transformer_allegro")
transformer_anyflow = _transformers_module("transformer_anyflow")
transformer_chronoedit = _transformers_module("transformer_chronoedit")
consisid_transformer_3d = _transformers_module("consisid_transformer_3d")
transformer_cosmos = _transformers_module("transformer_cosmos")
transformer_easyanimate = _transformers_module("transformer_easyanimate")
transformer_helios = _transformers_module("transformer_helios")
transformer_hunyuan_video = _transformers_module("transformer_hunyuan_video")
transformer_hunyuan_video15 = _transformers_module("transformer_hunyuan_video15")
transformer_kandinsky = _transformers_module("transformer_kandinsky")
transformer_kandinsky6 = _transformers_module("transformer_kandinsky6")
transformer_ltx = _transformers_module("transformer_ltx")
transformer_ltx2 = _transformers_module("transformer_ltx2")
transformer_motif_video = _transformers_module("transformer_motif_video")
transformer_skyreels_v2 = _transformers_module("transformer_skyreels_v2")
transformer_wan = _transformers_module("transformer_wan")
transformer_wan_animate = _transformers_module("transformer_wan_animate")


@dataclasses.dataclass(frozen=True)
class Model:
    """A tiny model of one family and what the tests need to know of it: 5 frames of
    4 x 6 tokens (120, not a multiple of the 128-token tile; CogVideoX adds 7 text
    tokens before them, HunyuanVideo a prompt of 7 tokens after them of which its mask
    keeps 5), 2 heads of 64 (Allegro: 96)."""

    name: str
    build: Callable[[int], Any]      # layers -> model (fp32, CPU)
    latent_shape: tuple
    grid: stsa.VideoGrid             # as the calls report it (HunyuanVideo: the prompt tokens its mask keeps)
    blocks: tuple                    # the attributes holding the blocks, in the order they run
    layout: str                      # how the model's processor hands q, k, v to its attention
    stock: Callable[[], Any]         # the model's own processor
    stock_attention: tuple           # (module, name) of the attention function the stock processor calls
    extra_inputs: Callable[[Any, Any], dict] = lambda device, dtype: {}  # the forward's other arguments
    fuses: bool = True               # whether fuse_qkv_projections() fuses its self-attention
    padding_sees_keys: bool = True   # a padded prompt token's query row sees the kept keys (else nothing)
    timestep_dtype: Any = None       # what the pipeline casts the timestep to (None: fp32; "model": the model's)
    timestep_shape: tuple = (1,)     # the forward's timestep ([B], or AnyFlow's one per latent frame)
    # Our q, k or v as the model's own attention call takes it (Mochi's: [1, H, N, D] without the padding).
    as_stock: Callable[[Any, Any], Any] = lambda x, spec: x
    attention: str = "attn1"         # each block's self-attention module
    # A dense policy against the model's own output in fp32 (relative L2): the kernels round apart by ~1e-7.
    fp32_tolerance: float = 1e-6
    head_dim: int = 64
    rising_timesteps: bool = False   # the pipeline's timesteps rise over a generation (Mochi's: 1000 - t)


def _tiny_wan(layers):
    return diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                           in_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64,
                                           num_layers=layers, rope_max_seq_len=64)


def _tiny_cogvideox(layers):  # CogVideoX 1.5's shape: 2 latent frames a patch, rotary embedding
    return diffusers.CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=64, in_channels=4,
                                                 out_channels=4, time_embed_dim=32, text_embed_dim=TEXT_DIM,
                                                 num_layers=layers, sample_width=12, sample_height=8,
                                                 patch_size=2, patch_size_t=2, max_text_seq_length=TEXT_TOKENS,
                                                 use_rotary_positional_embeddings=True)


def _cogvideox_rotary(device, dtype):
    """The pipeline computes CogVideoX's rotary tables ([video tokens, D] cos and sin, fp32
    whatever the model's dtype); any tables do for comparing two processors."""
    generator = torch.Generator().manual_seed(3)
    return {"image_rotary_emb": tuple(torch.randn(120, 64, generator=generator).to(device) for _ in range(2))}


_HAS_WAN = _has(transformer_wan, "WanAttnProcessor")
WAN = Model("wan", _tiny_wan, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6), ("blocks",), "bnhd",
            transformer_wan.WanAttnProcessor, (transformer_wan, "dispatch_attention_fn")) if _HAS_WAN else None
COGVIDEOX = Model("cogvideox", _tiny_cogvideox, (1, 10, 4, 8, 12),
                  stsa.VideoGrid(5, 4, 6, text=TEXT_TOKENS, text_placement="before"), ("transformer_blocks",), "bhnd",
                  attention_processor.CogVideoXAttnProcessor2_0,
                  (attention_processor.F, "scaled_dot_product_attention"), _cogvideox_rotary)


def _tiny_consisid(layers):
    """CogVideoX 1.0's shape (no temporal patch) with the face path on: the facial extractor's
    features join by cross-attention after every block."""
    return diffusers.ConsisIDTransformer3DModel(num_attention_heads=2, attention_head_dim=64, in_channels=4,
                                                out_channels=4, time_embed_dim=32, text_embed_dim=TEXT_DIM,
                                                num_layers=layers, sample_width=12, sample_height=8, sample_frames=17,
                                                max_text_seq_length=TEXT_TOKENS,
                                                use_rotary_positional_embeddings=True, is_train_face=True,
                                                cross_attn_interval=1, cross_attn_dim_head=16, cross_attn_num_heads=2,
                                                LFE_id_dim=16, LFE_vit_dim=32, LFE_depth=2, LFE_dim_head=16,
                                                LFE_num_heads=2, LFE_num_id_token=2, LFE_num_querie=4,
                                                LFE_output_dim=85, LFE_ff_mult=1, LFE_num_scale=2)  # 85: 2/3 of 128


def _consisid_inputs(device, dtype):
    """The face's embedding and its ViT features at two scales, with CogVideoX's rotary tables."""
    generator = torch.Generator().manual_seed(15)
    return {"id_cond": torch.randn(1, 16, generator=generator).to(device, dtype),
            "id_vit_hidden": [torch.randn(1, 9, 32, generator=generator).to(device, dtype) for _ in range(2)],
            **_cogvideox_rotary(device, dtype)}


_HAS_CONSISID = _has(consisid_transformer_3d, "ConsisIDTransformer3DModel")
CONSISID = Model("consisid", _tiny_consisid, (1, 5, 4, 8, 12),
                 stsa.VideoGrid(5, 4, 6, text=TEXT_TOKENS, text_placement="before"), ("transformer_blocks",), "bhnd",
                 attention_processor.CogVideoXAttnProcessor2_0,
                 (attention_processor.F, "scaled_dot_product_attention"), _consisid_inputs,
                 fuses=False) if _HAS_CONSISID else None


def _tiny_hunyuan(layers):  # dual-stream blocks, then single-stream ones
    return diffusers.HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                    attention_head_dim=64, num_layers=(layers + 1) // 2,
                                                    num_single_layers=layers // 2, num_refiner_layers=1,
                                                    mlp_ratio=2.0, patch_size=2, patch_size_t=1,
                                                    text_embed_dim=TEXT_DIM, pooled_projection_dim=16,
                                                    rope_axes_dim=(16, 24, 24))


def hunyuan_inputs(device, dtype, kept=(5,)):
    """The prompt's mask (its first `kept` tokens per sample), pooled prompt, guidance."""
    mask = torch.tensor([[1] * n + [0] * (TEXT_TOKENS - n) for n in kept], device=device)
    generator = torch.Generator().manual_seed(4)
    return {"encoder_attention_mask": mask, "pooled_projections": torch.randn(len(kept), 16, generator=generator)
            .to(device, dtype), "guidance": torch.full((len(kept),), 6000.0, device=device)}


_HAS_HUNYUAN = _has(transformer_hunyuan_video, "HunyuanVideoAttnProcessor2_0")
HUNYUAN = Model("hunyuan", _tiny_hunyuan, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6, text=5),
                ("transformer_blocks", "single_transformer_blocks"), "bnhd",
                transformer_hunyuan_video.HunyuanVideoAttnProcessor2_0,
                (transformer_hunyuan_video, "dispatch_attention_fn"), hunyuan_inputs, fuses=False,
                attention="attn") if _HAS_HUNYUAN else None


def _tiny_wan_vace(layers):  # a control block for the first layer
    return diffusers.WanVACETransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                               in_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32,
                                               ffn_dim=64, num_layers=layers, rope_max_seq_len=64, vace_layers=[0],
                                               vace_in_channels=8)


def _vace_control(device, dtype):
    generator = torch.Generator().manual_seed(5)
    return {"control_hidden_states": torch.randn(1, 8, 5, 8, 12, generator=generator).to(device, dtype)}


_HAS_WAN_VACE = _has(transformer_wan, "WanAttnProcessor")
WAN_VACE = Model("wan-vace", _tiny_wan_vace, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6), ("vace_blocks", "blocks"),
                 "bnhd", transformer_wan.WanAttnProcessor, (transformer_wan, "dispatch_attention_fn"),
                 _vace_control) if _HAS_WAN_VACE else None


def _tiny_skyreels_v2(layers):
    return diffusers.SkyReelsV2Transformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                                  in_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32,
                                                  ffn_dim=64, num_layers=layers, rope_max_seq_len=64)


_HAS_SKYREELS_V2 = _has(transformer_skyreels_v2, "SkyReelsV2AttnProcessor")
SKYREELS_V2 = Model("skyreels-v2", _tiny_skyreels_v2, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6), ("blocks",), "bnhd",
                    transformer_skyreels_v2.SkyReelsV2AttnProcessor,
                    (transformer_skyreels_v2, "dispatch_attention_fn")) if _HAS_SKYREELS_V2 else None


def _tiny_ltx(layers):  # patch size 1: the latents come packed, [B, N, C]
    return diffusers.LTXVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                attention_head_dim=64, cross_attention_dim=128, num_layers=layers,
                                                caption_channels=TEXT_DIM)


def _ltx_inputs(device, dtype):
    """The prompt's mask and the latent grid, which LTX-Video's forward takes as numbers."""
    return {"encoder_attention_mask": torch.ones(1, TEXT_TOKENS, device=device), "num_frames": 5, "height": 4,
            "width": 6}


_HAS_LTX = _has(transformer_ltx, "LTXVideoAttnProcessor")
LTX = Model("ltx", _tiny_ltx, (1, 120, 4), stsa.VideoGrid(5, 4, 6), ("transformer_blocks",), "bnhd",
            transformer_ltx.LTXVideoAttnProcessor, (transformer_ltx, "dispatch_attention_fn"), _ltx_inputs,
            fuses=False) if _HAS_LTX else None


def _tiny_hunyuan15(layers):
    return diffusers.HunyuanVideo15Transformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                      attention_head_dim=64, num_layers=layers, num_refiner_layers=1,
                                                      mlp_ratio=2.0, patch_size=2, patch_size_t=1,
                                                      text_embed_dim=TEXT_DIM, text_embed_2_dim=16,
                                                      image_embed_dim=16, rope_axes_dim=(16, 24, 24))


def hunyuan15_inputs(device, dtype, kept=((5, 2),), image=False):
    """Per sample, the LLM prompt's and the ByT5 prompt's kept tokens (of 7 and 4), and 3
    image tokens, kept where ``image`` (image-to-video), else zero and dropped: the model
    puts the kept ones first (image, ByT5, LLM), the prompt 14 tokens in all."""
    generator = torch.Generator().manual_seed(6)
    images = torch.randn(len(kept), 3, 16, generator=generator) if image else torch.zeros(len(kept), 3, 16)
    return {"encoder_attention_mask": torch.tensor([[1] * n + [0] * (TEXT_TOKENS - n) for n, _ in kept],
                                                   device=device),
            "encoder_hidden_states_2": torch.randn(len(kept), 4, 16, generator=generator).to(device, dtype),
            "encoder_attention_mask_2": torch.tensor([[1] * n + [0] * (4 - n) for _, n in kept], device=device),
            "image_embeds": images.to(device, dtype)}


_HAS_HUNYUAN15 = _has(transformer_hunyuan_video15, "HunyuanVideo15AttnProcessor2_0")
HUNYUAN15 = Model("hunyuan15", _tiny_hunyuan15, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6, text=7),
                  ("transformer_blocks",), "bnhd", transformer_hunyuan_video15.HunyuanVideo15AttnProcessor2_0,
                  (transformer_hunyuan_video15, "dispatch_attention_fn"), hunyuan15_inputs, fuses=False,
                  padding_sees_keys=False, timestep_dtype="model", attention="attn") if _HAS_HUNYUAN15 else None


def _tiny_mochi(layers):
    model = diffusers.MochiTransformer3DModel(patch_size=2, num_attention_heads=2, attention_head_dim=64,
                                              num_layers=layers, pooled_projection_dim=16, in_channels=4,
                                              text_embed_dim=TEXT_DIM, time_embed_dim=32,
                                              max_sequence_length=TEXT_TOKENS)
    with torch.no_grad():  # the rotary embedding's frequencies start at zero (no rotation) until trained
        model.pos_frequencies.normal_(0, 0.5)
    return model


def mochi_inputs(device, dtype, kept=(5,)):
    mask = [[1] * n + [0] * (TEXT_TOKENS - n) for n in kept]
    return {"encoder_attention_mask": torch.tensor(mask, device=device)}


MOCHI = Model("mochi", _tiny_mochi, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6, text=5), ("transformer_blocks",),
              "bnhd", attention_processor.MochiAttnProcessor2_0,
              (attention_processor.F, "scaled_dot_product_attention"), mochi_inputs, fuses=False,
              # The model attends one sample at a time over its kept tokens, head-major.
              padding_sees_keys=False, as_stock=lambda x, spec: x[:, :spec.grid.tokens].transpose(1, 2),
              rising_timesteps=True)


def _tiny_wan_animate(layers):  # a face adapter after every block, a motion encoder of 16 x 16 faces
    return diffusers.WanAnimateTransformer3DModel(num_attention_heads=2, attention_head_dim=64, in_channels=12,
                                                  latent_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32,
                                                  ffn_dim=64, num_layers=layers, image_dim=16, rope_max_seq_len=64,
                                                  motion_encoder_channel_sizes={"4": 8, "8": 8, "16": 8},
                                                  motion_encoder_size=16, motion_style_dim=16, motion_dim=4,
                                                  motion_encoder_dim=16, face_encoder_hidden_dim=32,
                                                  face_encoder_num_heads=2, inject_face_latents_blocks=1)


def _wan_animate_inputs(device, dtype):
    """The reference image's embedding, the pose latents (one frame fewer than the video's:
    the first is the reference image's) and the face video."""
    generator = torch.Generator().manual_seed(10)
    return {name: torch.randn(*shape, generator=generator).to(device, dtype)
            for name, shape in (("encoder_hidden_states_image", (1, 3, 16)), ("pose_hidden_states", (1, 4, 4, 8, 12)),
                                ("face_pixel_values", (1, 3, 13, 16, 16)))}


_HAS_WAN_ANIMATE = _has(transformer_wan_animate, "WanAttnProcessor")
WAN_ANIMATE = Model("wan-animate", _tiny_wan_animate, (1, 12, 5, 8, 12), stsa.VideoGrid(5, 4, 6), ("blocks",), "bnhd",
                    transformer_wan_animate.WanAttnProcessor, (transformer_wan_animate, "dispatch_attention_fn"),
                    _wan_animate_inputs) if _HAS_WAN_ANIMATE else None


def _tiny_chronoedit(layers):
    return diffusers.ChronoEditTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                                  in_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32,
                                                  ffn_dim=64, num_layers=layers, rope_max_seq_len=64)


_HAS_CHRONOEDIT = _has(transformer_chronoedit, "WanAttnProcessor")
CHRONOEDIT = Model("chronoedit", _tiny_chronoedit, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6), ("blocks",), "bnhd",
                   transformer_chronoedit.WanAttnProcessor,
                   (transformer_chronoedit, "dispatch_attention_fn")) if _HAS_CHRONOEDIT else None


def tiny_ltx2(layers, rope_type="interleaved", perturbed_attn=True):
    """Per-head output gates and the guidance perturbation's processor (LTX-2.3's), an audio
    stream of 8 tokens."""
    return diffusers.LTX2VideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                 attention_head_dim=64, cross_attention_dim=128, audio_in_channels=4,
                                                 audio_out_channels=4, audio_num_attention_heads=2,
                                                 audio_attention_head_dim=32, audio_cross_attention_dim=64,
                                                 num_layers=layers, caption_channels=TEXT_DIM, gated_attn=True,
                                                 perturbed_attn=perturbed_attn, rope_type=rope_type)


def _ltx2_inputs(device, dtype):
    """The audio stream's latents and prompt, and the video's latent grid as numbers."""
    generator = torch.Generator().manual_seed(8)
    return {"audio_hidden_states": torch.randn(1, 8, 4, generator=generator).to(device, dtype),
            "audio_encoder_hidden_states": torch.randn(1, TEXT_TOKENS, TEXT_DIM, generator=generator).to(device, dtype),
            "num_frames": 5, "height": 4, "width": 6, "audio_num_frames": 8}


_HAS_LTX2 = _has(transformer_ltx2, "LTX2PerturbedAttnProcessor")
LTX2 = Model("ltx2", tiny_ltx2, (1, 120, 4), stsa.VideoGrid(5, 4, 6), ("transformer_blocks",), "bnhd",
             transformer_ltx2.LTX2PerturbedAttnProcessor, (transformer_ltx2, "dispatch_attention_fn"), _ltx2_inputs,
             fuses=False) if _HAS_LTX2 else None


def _tiny_kandinsky(layers):
    model = diffusers.Kandinsky5Transformer3DModel(in_visual_dim=4, in_text_dim=TEXT_DIM, in_text_dim2=16, time_dim=32,
                                                   out_visual_dim=4, patch_size=(1, 2, 2), model_dim=128, ff_dim=64,
                                                   num_text_blocks=1, num_visual_blocks=layers,
                                                   axes_dims=(16, 24, 24))
    return _open_modulations(model)


def _open_modulations(model):
    """Kandinsky's modulations start at zero (every attention's gate shut) until trained."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "modulation" in name:
                parameter.normal_(0, 0.5)
    return model


def _kandinsky_inputs(device, dtype):
    """The pooled prompt and the rotary embedding's positions (the video's and the prompt's)."""
    generator = torch.Generator().manual_seed(9)
    return {"pooled_projections": torch.randn(1, 16, generator=generator).to(device, dtype),
            "visual_rope_pos": tuple(torch.arange(n, device=device) for n in (5, 4, 6)),
            "text_rope_pos": torch.arange(TEXT_TOKENS, device=device)}


_HAS_KANDINSKY = _has(transformer_kandinsky, "Kandinsky5AttnProcessor")
KANDINSKY = Model("kandinsky", _tiny_kandinsky, (1, 5, 8, 12, 4), stsa.VideoGrid(5, 4, 6),
                  ("visual_transformer_blocks",), "bnhd", transformer_kandinsky.Kandinsky5AttnProcessor,
                  (transformer_kandinsky, "dispatch_attention_fn"), _kandinsky_inputs, fuses=False,
                  timestep_dtype="model", attention="self_attention",
                  # The model rounds its rotated q, k to bf16: the first layer's 1e-7 can flip a rounding in
                  # the second (2.5e-6 seen in 40 seeds, median 2.8e-7).
                  fp32_tolerance=1e-5) if _HAS_KANDINSKY else None


def _tiny_cosmos(layers):  # the padding mask's channel left out (resizing it needs torchvision)
    return diffusers.CosmosTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                              attention_head_dim=64, num_layers=layers, mlp_ratio=1.0,
                                              text_embed_dim=TEXT_DIM, adaln_lora_dim=16, max_size=(8, 16, 16),
                                              concat_padding_mask=False)


_HAS_COSMOS = _has(transformer_cosmos, "CosmosAttnProcessor2_0")
COSMOS = Model("cosmos", _tiny_cosmos, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6), ("transformer_blocks",), "bnhd",
               transformer_cosmos.CosmosAttnProcessor2_0, (transformer_cosmos, "dispatch_attention_fn"),
               fuses=False) if _HAS_COSMOS else None


def _tiny_anyflow(layers):
    return diffusers.AnyFlowTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                               in_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32,
                                               ffn_dim=64, num_layers=layers, rope_max_seq_len=64)


def _anyflow_inputs(device, dtype):
    """The flow map's target timestep, per latent frame (the forward's `timestep` is its source)."""
    return {"r_timestep": torch.full((1, 5), 500.0, device=device)}


_HAS_ANYFLOW = _has(transformer_anyflow, "AnyFlowAttnProcessor")
ANYFLOW = Model("anyflow", _tiny_anyflow, (1, 5, 4, 8, 12), stsa.VideoGrid(5, 4, 6), ("blocks",), "bnhd",
                transformer_anyflow.AnyFlowAttnProcessor, (transformer_anyflow, "dispatch_attention_fn"),
                _anyflow_inputs, fuses=False, timestep_shape=(1, 5)) if _HAS_ANYFLOW else None


def _tiny_framepack(layers):  # HunyuanVideo's blocks, the history's and the image's embedders
    return diffusers.HunyuanVideoFramepackTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=64, num_layers=(layers + 1) // 2,
        num_single_layers=layers // 2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
        text_embed_dim=TEXT_DIM, pooled_projection_dim=16, rope_axes_dim=(16, 24, 24), has_image_proj=True,
        image_proj_dim=16, has_clean_x_embedder=True)


def _history(device, dtype, samples, names, seed, indices_shape):
    """Framepack's and Helios's history, before the video's tokens: 2 latent frames at full
    resolution (48 tokens), 2 at half (6) and 4 at a quarter (2, padded): 56 tokens, and
    each one's frame indices (the video's, 8 to 12, follow them)."""
    generator = torch.Generator().manual_seed(seed)
    x, first = {}, 0
    for (latents, indices), frames in zip(names, (2, 2, 4)):
        x[latents] = torch.randn(samples, 4, frames, 8, 12, generator=generator).to(device, dtype)
        x[indices] = torch.arange(first, first + frames, device=device).view(indices_shape)
        first += frames
    return x


HISTORY_TOKENS = 56


def framepack_inputs(device, dtype, kept=(5,)):
    """As HunyuanVideo's, the image's 3 embeddings, the history and the video's frame indices."""
    generator = torch.Generator().manual_seed(11)
    names = (("latents_clean", "indices_latents_clean"), ("latents_history_2x", "indices_latents_history_2x"),
             ("latents_history_4x", "indices_latents_history_4x"))
    return {**hunyuan_inputs(device, dtype, kept), **_history(device, dtype, len(kept), names, 11, (-1,)),
            "image_embeds": torch.randn(len(kept), 3, 16, generator=generator).to(device, dtype),
            "indices_latents": torch.arange(8, 13, device=device)}


def _history_first(x, spec):
    """stsa's order (the video's tokens, the history's, then the rest) -> the model's."""
    video = spec.grid.video_tokens
    return torch.cat([x[:, video:video + HISTORY_TOKENS], x[:, :video], x[:, video + HISTORY_TOKENS:]], dim=1)


_HAS_FRAMEPACK = _has(transformer_hunyuan_video, "HunyuanVideoAttnProcessor2_0")
FRAMEPACK = Model("framepack", _tiny_framepack, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6, text=HISTORY_TOKENS + 3 + 5),
                  ("transformer_blocks", "single_transformer_blocks"), "bnhd",
                  transformer_hunyuan_video.HunyuanVideoAttnProcessor2_0,
                  (transformer_hunyuan_video, "dispatch_attention_fn"), framepack_inputs, fuses=False,
                  as_stock=_history_first, attention="attn") if _HAS_FRAMEPACK else None


def tiny_helios(layers, scale_in_fp32=False):
    """The history's keys amplified per head, by scales in the model's dtype: diffusers keeps
    them in fp32 (from_pretrained), which makes its own processor's keys fp32 in a bf16
    model and its attention call fail (test_helios_keeps_a_bf16_models_keys_bf16)."""
    model = diffusers.HeliosTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                               in_channels=4, out_channels=4, text_dim=TEXT_DIM, freq_dim=32,
                                               ffn_dim=64, num_layers=layers, rope_dim=(16, 24, 24),
                                               is_amplify_history=True)
    if not scale_in_fp32:
        model._keep_in_fp32_modules = [m for m in model._keep_in_fp32_modules if m != "history_key_scale"]
    with torch.no_grad():  # the scales start equal until trained
        for block in model.blocks:
            block.attn1.history_key_scale.normal_(0, 1)
    return model


def _helios_inputs(device, dtype):
    names = tuple((f"latents_history_{n}", f"indices_latents_history_{n}") for n in ("short", "mid", "long"))
    return {**_history(device, dtype, 1, names, 12, (1, -1)),
            "indices_hidden_states": torch.arange(8, 13, device=device).unsqueeze(0)}


_HAS_HELIOS = _has(transformer_helios, "HeliosAttnProcessor")
HELIOS = Model("helios", tiny_helios, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6, text=HISTORY_TOKENS), ("blocks",),
               "bnhd", transformer_helios.HeliosAttnProcessor, (transformer_helios, "dispatch_attention_fn"),
               _helios_inputs, as_stock=_history_first) if _HAS_HELIOS else None


def tiny_motif(layers, decoder_layers=0, cross_attention=False):  # dual-stream blocks, then single-stream ones
    return transformer_motif_video.MotifVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=64, num_layers=(layers + 1) // 2,
        num_single_layers=layers // 2 + decoder_layers, num_decoder_layers=decoder_layers, mlp_ratio=2.0,
        patch_size=2, patch_size_t=1, text_embed_dim=TEXT_DIM, image_embed_dim=24, rope_axes_dim=(16, 24, 24),
        enable_text_cross_attention_dual=cross_attention, enable_text_cross_attention_single=cross_attention)


def motif_inputs(device, dtype, kept=(5,), images=0):
    """The prompt's mask (its first `kept` tokens per sample) and `images` image embeddings."""
    mask = torch.tensor([[1] * n + [0] * (TEXT_TOKENS - n) for n in kept], device=device)
    x = {"encoder_attention_mask": mask}
    if images:
        generator = torch.Generator().manual_seed(21)
        x["image_embeds"] = torch.randn(len(kept), images, 24, generator=generator).to(device, dtype)
    return x


_HAS_MOTIF = _has(transformer_motif_video, "MotifVideoAttnProcessor2_0")
MOTIF = Model("motif", lambda layers: tiny_motif(layers), (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6, text=5),
              ("transformer_blocks", "single_transformer_blocks"), "bnhd",
              transformer_motif_video.MotifVideoAttnProcessor2_0, (transformer_motif_video, "dispatch_attention_fn"),
              motif_inputs, fuses=False, attention="attn") if _HAS_MOTIF else None


def _tiny_kandinsky6(layers):  # fused video and audio blocks, an audio stream of 8 tokens
    model = diffusers.Kandinsky6Transformer3DModel(in_visual_dim=4, out_visual_dim=4, in_text_dim=TEXT_DIM,
                                                   in_text_dim2=16, time_dim=32, model_dim=128, ff_dim=64,
                                                   num_text_blocks=1, num_visual_blocks=layers, axes_dims=(16, 24, 24),
                                                   visual_cond=False, in_audio_dim=4, out_audio_dim=4,
                                                   model_dim_a=64, time_dim_a=32, ff_dim_a=64,
                                                   axes_dims_a=(8, 12, 12))
    return _open_modulations(model)


def _kandinsky6_inputs(device, dtype):
    generator = torch.Generator().manual_seed(13)
    return {"pooled_projections": torch.randn(1, 16, generator=generator).to(device, dtype),
            "audio_hidden_states": torch.randn(1, 8, 4, generator=generator).to(device, dtype)}


_HAS_KANDINSKY6 = _has(transformer_kandinsky6, "Kandinsky6AttnProcessor")
KANDINSKY6 = Model("kandinsky6", _tiny_kandinsky6, (1, 5, 8, 12, 4), stsa.VideoGrid(5, 4, 6),
                   ("visual_transformer_blocks",), "bnhd", transformer_kandinsky6.Kandinsky6AttnProcessor,
                   (transformer_kandinsky6, "dispatch_attention_fn"), _kandinsky6_inputs, fuses=False,
                   attention="video_dec_block.self_attention") if _HAS_KANDINSKY6 else None


def _tiny_easyanimate(layers):  # an MMDiT block (the prompt's own projections) first, then shared ones
    return diffusers.EasyAnimateTransformer3DModel(num_attention_heads=2, attention_head_dim=64, in_channels=4,
                                                   out_channels=4, patch_size=2, time_embed_dim=32,
                                                   text_embed_dim=TEXT_DIM, text_embed_dim_t5=TEXT_DIM,
                                                   num_layers=layers, mmdit_layers=1)


def _easyanimate_inputs(device, dtype):
    """A T5 prompt of 3 tokens after the first encoder's 7."""
    generator = torch.Generator().manual_seed(14)
    return {"encoder_hidden_states_t5": torch.randn(1, 3, TEXT_DIM, generator=generator).to(device, dtype)}


_HAS_EASYANIMATE = _has(transformer_easyanimate, "EasyAnimateAttnProcessor2_0")
EASYANIMATE = Model("easyanimate", _tiny_easyanimate, (1, 4, 5, 8, 12),
                    stsa.VideoGrid(5, 4, 6, text=TEXT_TOKENS + 3, text_placement="before"), ("transformer_blocks",),
                    "bhnd", transformer_easyanimate.EasyAnimateAttnProcessor2_0,
                    (transformer_easyanimate.F, "scaled_dot_product_attention"), _easyanimate_inputs,
                    fuses=False) if _HAS_EASYANIMATE else None


def _tiny_allegro(layers):  # its heads of 96
    return diffusers.AllegroTransformer3DModel(num_attention_heads=2, attention_head_dim=96, in_channels=4,
                                               out_channels=4, num_layers=layers, cross_attention_dim=192,
                                               caption_channels=TEXT_DIM, sample_height=8, sample_width=12,
                                               sample_frames=5)


def _allegro_inputs(device, dtype):
    """The rotary embedding as the pipeline makes it (per axis frequencies, each token's position)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    *freqs, t, h, w = get_3d_rotary_pos_embed_allegro(embed_dim=96, crops_coords=((0, 0), (4, 6)), grid_size=(4, 6),
                                                      temporal_size=5, interpolation_scale=(2.2, 2.0, 2.0),
                                                      device=device)
    positions = torch.cartesian_prod(t.long(), h.long(), w.long()).reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1)
    return {"image_rotary_emb": (freqs, positions.contiguous())}


ALLEGRO = Model("allegro", _tiny_allegro, (1, 4, 5, 8, 12), stsa.VideoGrid(5, 4, 6), ("transformer_blocks",), "bhnd",
                attention_processor.AllegroAttnProcessor2_0, (attention_processor.F, "scaled_dot_product_attention"),
                _allegro_inputs, fuses=False, head_dim=96)


def param(spec, name):
    """One family as a test parameter, skipped where this diffusers lacks it (spec None)."""
    return pytest.param(spec, id=name, marks=needs(spec))


def needs(*specs):
    """Skips a test that takes these families where this diffusers lacks one of them."""
    return pytest.mark.skipif(any(spec is None for spec in specs),
                              reason=f"diffusers {diffusers.__version__} lacks a family this test takes")


MODELS = [param(WAN, "wan"), param(COGVIDEOX, "cogvideox"), param(HUNYUAN, "hunyuan"), param(WAN_VACE, "wan-vace"),
          param(SKYREELS_V2, "skyreels-v2"), param(LTX, "ltx"), param(HUNYUAN15, "hunyuan15"), param(MOCHI, "mochi"),
          param(CHRONOEDIT, "chronoedit"), param(LTX2, "ltx2"), param(KANDINSKY, "kandinsky"),
          param(COSMOS, "cosmos"), param(WAN_ANIMATE, "wan-animate"), param(ANYFLOW, "anyflow"),
          param(FRAMEPACK, "framepack"), param(HELIOS, "helios"), param(KANDINSKY6, "kandinsky6"),
          param(EASYANIMATE, "easyanimate"), param(ALLEGRO, "allegro"), param(CONSISID, "consisid"),
          param(MOTIF, "motif")]


def tiny(spec=WAN, device="cpu", dtype=torch.float32, layers=2):
    torch.manual_seed(0)
    model = spec.build(layers).to(device=device, dtype=dtype)
    for name, parameter in model.named_parameters():  # as from_pretrained(torch_dtype=...) leaves them
        if any(keep in name.split(".") for keep in getattr(model, "_keep_in_fp32_modules", None) or ()):
            parameter.data = parameter.data.float()
    return model.eval()


def tiny_wan(device="cpu", dtype=torch.float32, layers=2):
    return tiny(WAN, device, dtype, layers)


def inputs(rng, timestep, device="cpu", dtype=torch.float32, spec=WAN):
    latents = torch.from_numpy(rng.standard_normal(spec.latent_shape).astype(np.float32))
    text = torch.from_numpy(rng.standard_normal((1, TEXT_TOKENS, TEXT_DIM)).astype(np.float32))
    timestep = torch.full(spec.timestep_shape, float(timestep), device=device,
                          dtype=dtype if spec.timestep_dtype == "model" else torch.float32)
    return {"hidden_states": latents.to(device, dtype), "timestep": timestep,
            "encoder_hidden_states": text.to(device, dtype), **spec.extra_inputs(device, dtype)}


def denoising(spec, *timesteps):
    """A generation's timesteps (999, 500, ...) as the family's pipeline passes them: Mochi's inverted
    scheduler counts them up from 0 (1000 - t)."""
    return [1000 - t for t in timesteps] if spec.rising_timesteps else list(timesteps)


def attentions(model, spec=WAN):
    """Every block's self-attention module, in the order the layers run."""
    return [operator.attrgetter(spec.attention)(block) for name in spec.blocks for block in getattr(model, name)]
