"""Webhooks: the routes (/v1/webhooks), where they may go (guard) and the dispatcher."""
