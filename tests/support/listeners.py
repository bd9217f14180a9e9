"""Transaction listeners that tests share."""

from txbroker.client import TransactionListener


class Decided(TransactionListener):
    """Answers `state` to both the local transaction and every check-back (None counts as UNKNOWN)."""

    def __init__(self, state):
        self.state = state

    def execute_local_transaction(self, msg, arg):
        return self.state

    def check_local_transaction(self, msg):
        return self.state
