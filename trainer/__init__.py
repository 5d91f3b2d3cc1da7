"""BroRL: the training library. Pure: no web, database or queue imports.

`train` is imported lazily so that `trainer.spec` stays importable without torch.
"""


def train(spec, sink, should_stop, resume=None, **kwargs):
    from trainer.loop import train as _train

    return _train(spec, sink, should_stop, resume=resume, **kwargs)
