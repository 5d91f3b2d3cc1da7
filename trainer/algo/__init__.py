"""The algorithm's pure pieces: advantages, the loss terms, dynamic-sampling filter, pass@k and
the broadening schedule with its learning-rate rule. No model, no engine: tensors and numbers."""
