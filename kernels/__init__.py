"""GPU fast paths, each beside its pure-torch reference (installed as `dllm.kernels`)."""
from .scoring import TokenScores, token_scores, token_scores_ref

__all__ = ["TokenScores", "token_scores", "token_scores_ref"]
