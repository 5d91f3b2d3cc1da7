"""brorl local commands."""


def register(app):
    pass
