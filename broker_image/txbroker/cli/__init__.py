"""The `txbroker` command."""
