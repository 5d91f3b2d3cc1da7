"""The policy as a Hugging Face model: loading, dtypes and `builtin:tiny` (built, not downloaded)."""
