"""The rollout engine: batched sampling with a KV cache over the policy's packed forward.

``rollout`` drives generation and scoring, ``sampling`` the keyed random numbers, ``kv_cache`` the
cache, ``fast_decoder`` the fused forward, and ``evaluation`` evaluates a policy alone on a split.
"""
