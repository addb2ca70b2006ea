"""Memory arithmetic: config.json or a GGUF header to a model shape, then weights, KV cache and
activation per GPU in each engine's own units, and the search for a launch that fits.

In: a config, GPU sizes, launch settings. Out: `ModelShape`, `Plan`, the fitting variants.
"""
