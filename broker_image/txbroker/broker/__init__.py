"""The broker process: data plane (connection.py, processors/), admin plane (admin.py),
transactions (the transaction/ package), wired together in server.py."""
