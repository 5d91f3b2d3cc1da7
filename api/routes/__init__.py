"""HTTP routers, one module per resource; `api.app.create_app` mounts them under `/v1`."""
