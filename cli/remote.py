"""brorl remote commands."""


def register(app):
    pass
