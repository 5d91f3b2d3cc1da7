"""The `brorl` command line: client, server, and local trainer commands."""
