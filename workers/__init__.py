"""arq workers that precompute summaries for ctxstore sessions."""
