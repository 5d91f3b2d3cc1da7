"""brorl server commands."""


def register(app):
    pass
