"""Transactions on the broker: half messages and their end (`service.py`), coordinated
transactions whose decision ends their members (`jobs.py`), check-back of the undecided
(`check_service.py`, or over HTTP: `webhook_check.py`) and the per-group settings they run under
(`settings.py`)."""
