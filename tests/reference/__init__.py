"""Independent plain-torch oracles for the dllm runtime.

`arch_ref` re-implements the LLaDA and Dream forwards (docs/fidelity.md §Architectures);
`samplers_ref` transcribes the published decoding loops (ML-GSAI/LLaDA ``generate.py``, Dream's
``diffusion_generate``). Written to be read, not to be fast; nothing here imports `dllm`.
"""
