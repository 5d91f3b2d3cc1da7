"""Checkpoints: the torch-free format (`format`, shared with the store) and save/load (`io`)."""
