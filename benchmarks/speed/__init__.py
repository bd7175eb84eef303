"""Speed: vitzoo against timm and torchvision on the same architecture, weights and inputs.

    python -m benchmarks speed [--quick] [--device cpu|cuda|auto]
    python -m benchmarks.speed [--only inference|training|fastest] [--quick] [--device ...]   (one kind of case)

Every peer is built with random weights, vitzoo loads the same weights through its converters (and
its logits are checked against the peer's), and repetitions of all contestants are interleaved in one
process, so that a change of machine load hits all of them alike. Reported: median images/s and the
spread (min-max) over repetitions, float32 and bf16 autocast, inference at batch 1, 8 and 32, a
training step (forward, backward, AdamW), the peak memory training adds to the weights (gradients,
optimizer state, activations: tensor bytes, and resident memory beside them, in a fresh child process
per contestant; for a compiled contestant, the compiler's own memory is measured apart), minor page
faults per call, and each contestant's share of the matrix-product ceiling: the rate torch.mm
reaches, in the same run and precision, at the encoder's own product shapes (q/k/v, projection, the
MLP's two layers at that batch), so that CPUs whose matrix units differ (e.g. 430 vs 835 GFLOP/s in
bf16) can be read side by side. Every record carries the CPU's model, family and instruction-set flags.

Contestants: `vitzoo` (eager), `vitzoo+compile` (`vitzoo.inference`: Inductor with frozen weights for
inference; for training a compiled step with AdamW's fused kernel, as `vitzoo train` has it), in bf16 `vitzoo.fast` (`vitzoo.inference.for_inference`: weights cast
to bf16 once, no autocast) and, at batch 8, `vitzoo.fast+compile` (the same, compiled with frozen
weights), for bf16 training on the CPU `vitzoo+compile+stored_probabilities` (the compiled step of a
model with `set_attention_probabilities_stored()`), and each peer eager; for inference at batch 8 the
peers are also compiled the same way, so that the effect of the compiler and the effect of the implementation can be
told apart. On CUDA the timings synchronise the device, peak memory is the allocator's, and vitzoo
is also timed with each of scaled_dot_product_attention's kernels forced (`vitzoo[flash]`,
`vitzoo[mem_efficient]`, `vitzoo[cudnn]`, `vitzoo[math]`); training batches are 8x larger there.

Each at its fastest (inference, batch 8): every peer eager in float32 and in the device's half precision
under autocast, its faster one counted, against `vitzoo.inference.for_inference(model)` with no
argument (the contestant `vitzoo.fast()`: the precision `vitzoo.precision.fastest` picks for the
device, eager) and vitzoo's eager float32.

The modules, in the order a case is measured:

    cases     what is measured: the cases (vitzoo and its peers on the same weights), the precisions,
              the contestants' names, a training step
    timing    how a timing is kept fair: interleaved repetitions, page faults, device synchronisation,
              attention kernels, the matrix-product ceiling, a fresh compiler per case
    memory    the peak memory a training step adds, probed in a fresh process per contestant
    measure   inference, training and each-at-its-fastest cases, measured and stored; `main`
    report    the README: tables, speed-ups over the faster peer, ceilings, the figure
"""
