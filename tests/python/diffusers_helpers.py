"""What the diffusers-facing test files share: a diffusers WanPipeline around tiny
transformers, without a text encoder (the tests pass prompt embeddings), and the eager and
regionally compiled runs a compile test compares. Imported only after
pytest.importorskip("diffusers"); WanPipeline needs transformers too."""

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


def regional_compile_runs(model, steps, forward, policy_settings):
    """What a test of diffusers' regional compilation compares: `forward(model, x)` for each of
    `steps` with stsa enabled (a fresh stsa.Policy(**policy_settings) each time), eager, then
    after compile_repeated_blocks(fullgraph=True; a graph break would raise). Returns the number
    of stsa operators in each graph compiled, and (outputs, records as (step, layer, routes))
    of the eager run and of the compiled one."""
    import stsa
    import stsa.diffusers
    import torch

    graphs = []

    def backend(gm, example_inputs):
        ops = [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
        graphs.append(ops.count("stsa.diffusers_attention"))
        return torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

    torch._dynamo.reset()
    runs = []
    for compiled in (False, True):
        if compiled:
            model.compile_repeated_blocks(fullgraph=True, backend=backend)
        with stsa.diffusers.enable(model, stsa.Policy(**policy_settings)) as sparse:
            outputs = [forward(model, x) for x in steps]
        runs.append((outputs, [(r.step, r.layer, r.routes) for r in sparse.records]))
    torch._dynamo.reset()
    return graphs, runs
