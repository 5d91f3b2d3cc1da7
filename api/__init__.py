"""The HTTP control plane: a FastAPI app (`api.app.create_app`) over the store.

It validates job specs, writes rows, enqueues job ids by task name after the commit, and
serves jobs, metrics, checkpoints and datasets back. It never imports torch, vLLM or the
trainer's internals (only `trainer.spec` and the dataset validator, both torch-free).
"""
