"""The paper's token-level theory and simulation (no language model)."""
