"""The log-ratio clamp the objective modules share (their masked-tensor helpers are ``satrl.tensors``)."""

# Log-ratios are clamped to this range before ``exp``: e^20 ~ 4.9e8 is far beyond any clip bound, yet
# finite in float32 and bfloat16, so very stale tokens cannot overflow. Tokens beyond it get zero
# gradient through the clamp (they are far outside every trust region anyway).
LOG_RATIO_CLAMP = 20.0
