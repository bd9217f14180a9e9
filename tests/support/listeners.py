"""Transaction listeners that tests share."""

from txbroker.client import LocalTransactionState as S, TransactionListener


class Decided(TransactionListener):
    """Answers `state` to both the local transaction and every check-back (None counts as UNKNOWN)."""

    def __init__(self, state):
        self.state = state

    def execute_local_transaction(self, msg, arg):
        return self.state

    def check_local_transaction(self, msg):
        return self.state


class CommitOnCheck(TransactionListener):
    """Leaves the local transaction UNKNOWN, answers COMMIT when checked back."""

    def execute_local_transaction(self, msg, arg):
        return S.UNKNOWN

    def check_local_transaction(self, msg):
        return S.COMMIT


class NeverDecides(TransactionListener):
    """Leaves every transaction UNKNOWN, checked back or not."""

    def execute_local_transaction(self, msg, arg):
        return S.UNKNOWN

    def check_local_transaction(self, msg):
        return S.UNKNOWN
