"""The broker process: data plane (connection.py, processors/), admin plane (admin.py),
transactions (transactions.py, check_service.py), wired together in server.py."""
