"""What the diffusers-facing test files share: a diffusers WanPipeline around tiny
transformers, without a text encoder (the tests pass prompt embeddings). Imported only
after pytest.importorskip("diffusers"); WanPipeline needs transformers too."""

import diffusers

TEXT_TOKENS, TEXT_DIM = 7, 32  # the prompt's embeddings the tiny transformers take


def wan_pipeline(transformer, transformer_2=None, boundary_ratio=None):
    """A WanPipeline of 64 x 96 pixels a frame (5 x 4 x 6 latent tokens for 17 frames), its
    VAE tiny and random, Wan2.2's scheduler (UniPC, flow shift 12)."""
    vae = diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                     temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
                                     latents_std=[1.0] * 4)
    scheduler = diffusers.UniPCMultistepScheduler(flow_shift=12.0, use_flow_sigmas=True,
                                                  prediction_type="flow_prediction")
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler,
                                 transformer=transformer, transformer_2=transformer_2, boundary_ratio=boundary_ratio)
    pipe.set_progress_bar_config(disable=True)
    return pipe
